// Porthole's JavaScript runner. It is the init process of one sandbox and serves exactly one run:
//   1. signal readiness by writing "R" to fd 3 (the result channel),
//   2. read one request {source, state} from stdin until EOF (EOF with no bytes means "exit"),
//   3. run `source` as the body of an async function with `state` in scope,
//   4. write {ok, result|error, state} as one line of JSON to fd 3 and exit.
// console.log goes to stdout, which sandboxd captures separately.
'use strict';
const fs = require('fs');

// The answer channel: fd 3 in an ephemeral sandbox; a session's agent names another in the environment.
const RESULT_FD = Number(process.env.PORTHOLE_ANSWER_FD || 3);
delete process.env.PORTHOLE_ANSWER_FD;
let answered = false;

function errorInfo(e) {
  if (e instanceof Error) {
    return { type: e.name || 'Error', message: String(e.message), stack: String(e.stack || '') };
  }
  let message;
  try { message = typeof e === 'string' ? e : JSON.stringify(e); } catch (_) { message = String(e); }
  return { type: 'Thrown', message: String(message), stack: '' };
}

function answer(payload) {
  if (answered) return;
  answered = true;
  let text;
  try {
    text = JSON.stringify(payload);
  } catch (e) {
    text = JSON.stringify({
      ok: false,
      error: { type: 'SerializationError', message: 'result or state is not JSON-serialisable: ' + e.message, stack: '' },
      state: null,
    });
  }
  // Pipe writes can be queued in Node: flush stdout and stderr before exiting, or output is lost.
  let pending = 2;
  const finish = () => {
    if (--pending > 0) return;
    // The newline ends the answer: sandboxd does not wait for EOF, which only comes once the runtime
    // process (which also holds this pipe) has exited. JSON text never contains a raw newline.
    fs.writeSync(RESULT_FD, text + '\n');
    fs.closeSync(RESULT_FD);
    process.exit(0);
  };
  process.stdout.write('', finish);
  process.stderr.write('', finish);
}

process.on('uncaughtException', (e) => answer({ ok: false, error: errorInfo(e), state: null }));
process.on('unhandledRejection', (e) => answer({ ok: false, error: errorInfo(e), state: null }));

// Code made by the Function constructor runs in global scope, where CommonJS's `require` is missing:
// give it one that resolves from /workspace, so require('./lib') finds the sandbox's files.
globalThis.require = require('module').createRequire('/workspace/index.js');
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;

// Warm up before declaring readiness: process.stdout/stderr are built lazily (loading the stream and
// pipe modules), and the first compile and JSON round trip are slow. Paying it now keeps it off the run.
process.stdout.write('');
process.stderr.write('');
JSON.stringify(JSON.parse('{"warm":[1,"x",null]}'));
new AsyncFunction('state', 'return state;')({});

fs.writeSync(RESULT_FD, 'R');
const input = fs.readFileSync(0);
if (input.length === 0) process.exit(0);
const req = JSON.parse(input.toString('utf8'));
const state = req.state === undefined || req.state === null ? {} : req.state;
(async () => {
  let fn;
  try {
    fn = new AsyncFunction('state', req.source);
  } catch (e) {
    return answer({ ok: false, error: errorInfo(e), state });
  }
  try {
    const result = await fn(state);
    answer({ ok: true, result: result === undefined ? null : result, state });
  } catch (e) {
    answer({ ok: false, error: errorInfo(e), state });
  }
})();
