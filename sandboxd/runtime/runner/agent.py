# Porthole's session agent: pid 1 of a durable session's sandbox.
#
# It listens on a unix socket (/run/porthole/agent.sock, a directory sandboxd also sees from the host)
# and serves one JSON request per connection:
#   ping                         -> {"ok": true, "pid": 1}
#   execute {language, source, state, timeoutMs, limits}
#                                -> the run's answer (same shape as an ephemeral run)
#   spawn {cmd, cwd, env}        -> {"pid": N}
#   list                         -> {"processes": [...]}
#   status {pid}                 -> one process
#   logs {pid, tail, follow}     -> {"stream", "data"} lines; with follow, until the process ends
#   kill {pid, signal}           -> {"ok": true}
#
# The agent runs as the same unprivileged user as the code it serves: it is a convenience inside the
# sandbox, not a security boundary. sandboxd treats every answer as untrusted (bounded, with timeouts).
import collections
import json
import os
import select
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time

SOCKET = "/run/porthole/agent.sock"
RUNNERS = {
    "javascript": ["/usr/bin/node", "/opt/porthole/runner.js"],
    "python": ["/usr/bin/python3", "-I", "-u", "/opt/porthole/runner.py"],
}
LOG_BYTES = 1 << 20  # per process and stream kept for logs
MAX_PROCESSES = 64   # background processes remembered (running or exited)

_lock = threading.Lock()
_cond = threading.Condition(_lock)
_exits = {}        # pid -> exit code (negative: killed by that signal), filled by the reaper
_procs = collections.OrderedDict()  # pid -> Proc (background processes)


def reaper():
    # As pid 1 the agent inherits every orphan: reap all children, remember exit codes.
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.05)
            continue
        except InterruptedError:
            continue
        code = os.waitstatus_to_exitcode(status)
        with _cond:
            _exits[pid] = code
            p = _procs.get(pid)
            if p is not None:
                p.exit_code = code
                p.ended_at = time.time()
            if len(_exits) > 4096:
                for k in list(_exits)[:2048]:
                    _exits.pop(k, None)
            _cond.notify_all()


def wait_exit(pid, timeout):
    deadline = time.monotonic() + timeout
    with _cond:
        while pid not in _exits:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            _cond.wait(left)
        return _exits[pid]


class Capture:
    """Reads a pipe to EOF, keeping the first `limit` bytes (execute) or the last `limit` (logs)."""

    def __init__(self, fd, limit, keep_tail=False, on_data=None):
        self.fd, self.limit, self.keep_tail, self.on_data = fd, limit, keep_tail, on_data
        self.buf = bytearray()
        self.total = 0  # bytes ever read, so followers can tell what is new after the tail is trimmed
        self.truncated = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with _cond:
                self.total += len(chunk)
                if self.keep_tail:
                    self.buf += chunk
                    if len(self.buf) > self.limit:
                        del self.buf[: len(self.buf) - self.limit]
                        self.truncated = True
                else:
                    room = self.limit - len(self.buf)
                    if len(chunk) > room:
                        self.truncated = True
                        chunk = chunk[: max(room, 0)]
                    self.buf += chunk
                if self.on_data:
                    self.on_data()
        os.close(self.fd)

    def text(self):
        with _cond:
            return bytes(self.buf).decode("utf-8", "replace")


class Proc:
    def __init__(self, popen, cmd, cwd):
        self.popen = popen  # kept so Python never reaps it behind the reaper's back
        self.pid = popen.pid
        self.cmd, self.cwd = cmd, cwd
        self.started_at = time.time()
        self.ended_at = None
        self.exit_code = None

    def info(self):
        return {
            "pid": self.pid, "cmd": self.cmd, "cwd": self.cwd,
            "state": "running" if self.exit_code is None else "exited",
            "exitCode": self.exit_code,
            "startedAt": self.started_at, "endedAt": self.ended_at,
        }


# ---------------------------------------------------------------- execute


class Runner:
    """A started runner waiting for its request (it wrote 'R' on the answer pipe)."""

    def __init__(self, language, limits):
        self.language = language
        ans_r, ans_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        env = dict(os.environ, PORTHOLE_ANSWER_FD=str(ans_w))
        self.popen = subprocess.Popen(
            RUNNERS[language], stdin=subprocess.PIPE, stdout=out_w, stderr=err_w, pass_fds=(ans_w,),
            cwd="/workspace", env=env, start_new_session=True, close_fds=True)
        os.close(ans_w)
        os.close(out_w)
        os.close(err_w)
        self.pid = self.popen.pid
        self.answer = os.fdopen(ans_r, "rb", buffering=0)
        self.stdout = Capture(out_r, limits.get("stdoutBytes", 1 << 20))
        self.stderr = Capture(err_r, limits.get("stderrBytes", 1 << 20))
        self.ready = self.answer.read(1) == b"R"

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass


_warm = {}     # language -> Runner, ready
_warming = {}  # language -> threading.Event, set when the runner being started is in _warm
_warm_lock = threading.Lock()


def warm_up(language, limits):
    with _warm_lock:
        if language in _warm or language in _warming:
            return
        done = _warming[language] = threading.Event()
    try:
        r = Runner(language, limits)
    except Exception as e:  # noqa: BLE001 - report and carry on; execute starts one cold
        print("agent: warm runner failed:", e, file=sys.stderr, flush=True)
        r = None
    with _warm_lock:
        if r is not None:
            _warm[language] = r
        del _warming[language]
    done.set()


def take_runner(language, limits):
    # A runner still starting is worth waiting for: starting a second one would only slow both.
    with _warm_lock:
        pending = _warming.get(language)
    if pending is not None:
        pending.wait(30)
    with _warm_lock:
        r = _warm.pop(language, None)
    if r is not None and r.ready and r.popen.pid not in _exits:
        return r
    if r is not None:
        r.kill()
    return Runner(language, limits)


def read_answer(f, limit, deadline):
    # One line of JSON, at most `limit` bytes, before the deadline.
    line = bytearray()
    fd = f.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, "timeout"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None, "timeout"
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, "eof"
        line += chunk
        if len(line) > limit:
            return None, "too_large"
        if b"\n" in line:
            return bytes(line[: line.index(b"\n")]), None


def execute(req):
    language = req.get("language")
    if language not in RUNNERS:
        return {"agentError": "unknown language %r" % language}
    limits = req.get("limits") or {}
    timeout = float(req.get("timeoutMs", 8000)) / 1000.0
    r = take_runner(language, limits)
    start = time.monotonic()
    payload = json.dumps({"source": req.get("source", ""), "state": req.get("state")}).encode()

    def feed():
        try:
            r.popen.stdin.write(payload)
            r.popen.stdin.close()
        except OSError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    limit = limits.get("resultBytes", 1 << 20) + 2 * limits.get("stateBytes", 256 << 10) + (64 << 10)
    raw, why = read_answer(r.answer, limit, start + timeout)
    duration = (time.monotonic() - start) * 1000.0
    # Whatever the code left running dies with the run: the runner's process group is killed, which
    # also closes the output pipes, so the capture threads finish with everything written.
    r.kill()
    r.stdout.thread.join(2)
    r.stderr.thread.join(2)
    r.answer.close()
    code = wait_exit(r.pid, 5) if why == "eof" else None
    res = {
        "stdout": r.stdout.text(), "stderr": r.stderr.text(),
        "stdoutTruncated": r.stdout.truncated, "stderrTruncated": r.stderr.truncated,
        "durationMs": duration, "timedOut": why == "timeout",
    }
    if why == "timeout":
        res.update(ok=False, outcome="timeout", error={"type": "Timeout", "message": "the run did not finish within %d ms" % int(timeout * 1000), "stack": ""})
    elif why == "too_large":
        res.update(ok=False, outcome="too_large", error={"type": "ResultTooLarge", "message": "the answer exceeds the result and state limits", "stack": ""})
    elif why == "eof":
        oom = code == -signal.SIGKILL
        res.update(ok=False, outcome="oom" if oom else "exited", error={
            "type": "OutOfMemory" if oom else "ProcessExited",
            "message": "the program was killed (out of memory?)" if oom else "the program ended (exit status %s) before returning a result" % code,
            "stack": ""})
    else:
        res["answer"] = raw.decode("utf-8", "replace")
    # The next execute of this language finds a runner ready.
    threading.Thread(target=warm_up, args=(language, limits), daemon=True).start()
    return res


# ---------------------------------------------------------------- background processes


def spawn(req):
    cmd = req.get("cmd")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
        return {"agentError": "cmd must be a non-empty list of strings"}
    cwd = req.get("cwd") or "/workspace"
    env = dict(os.environ)
    env.pop("PORTHOLE_ANSWER_FD", None)
    env.update(req.get("env") or {})
    with _cond:
        running = sum(1 for p in _procs.values() if p.exit_code is None)
    if running >= MAX_PROCESSES:
        return {"agentError": "too many processes (limit %d)" % MAX_PROCESSES, "code": "limit"}
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, cwd=cwd, env=env,
                                 start_new_session=True, close_fds=True)
    except OSError as e:
        os.close(out_r)
        os.close(err_r)
        return {"agentError": "cannot start %s: %s" % (cmd[0], e.strerror or e), "code": "spawn"}
    finally:
        os.close(out_w)
        os.close(err_w)
    p = Proc(popen, cmd, cwd)

    p.stdout = Capture(out_r, LOG_BYTES, keep_tail=True, on_data=_cond.notify_all)
    p.stderr = Capture(err_r, LOG_BYTES, keep_tail=True, on_data=_cond.notify_all)
    with _cond:
        _procs[p.pid] = p
        if p.pid in _exits:
            p.exit_code = _exits[p.pid]
            p.ended_at = time.time()
        # Forget the oldest exited processes beyond the bound.
        while len(_procs) > MAX_PROCESSES:
            for pid, q in _procs.items():
                if q.exit_code is not None:
                    del _procs[pid]
                    break
            else:
                break
    return p.info()


def tail_lines(text, n):
    if n is None or n <= 0:
        return text
    lines = text.splitlines(keepends=True)
    return "".join(lines[-n:])


class Handler(socketserver.StreamRequestHandler):
    def send(self, obj):
        self.wfile.write(json.dumps(obj).encode() + b"\n")
        self.wfile.flush()

    def handle(self):
        line = self.rfile.readline(4 << 20)
        try:
            req = json.loads(line)
        except ValueError:
            self.send({"agentError": "malformed request"})
            return
        op = req.get("op")
        try:
            if op == "ping":
                self.send({"ok": True, "pid": os.getpid()})
            elif op == "execute":
                self.send(execute(req))
            elif op == "warm":
                warm_up(req.get("language"), req.get("limits") or {})
                self.send({"ok": True})
            elif op == "spawn":
                self.send(spawn(req))
            elif op == "list":
                with _cond:
                    self.send({"processes": [p.info() for p in _procs.values()]})
            elif op in ("status", "logs", "kill"):
                with _cond:
                    p = _procs.get(req.get("pid"))
                if p is None:
                    self.send({"agentError": "no such process", "code": "not_found"})
                elif op == "status":
                    self.send(p.info())
                elif op == "kill":
                    sig = int(req.get("signal", signal.SIGTERM))
                    try:
                        os.killpg(p.pid, sig)
                    except OSError:
                        pass
                    self.send({"ok": True})
                else:
                    self.logs(p, req)
            else:
                self.send({"agentError": "unknown op %r" % op})
        except BrokenPipeError:
            pass

    def logs(self, p, req):
        n = req.get("tail")
        sent = {}
        with _cond:
            for name in ("stdout", "stderr"):
                c = getattr(p, name)
                sent[name] = c.total
                data = tail_lines(bytes(c.buf).decode("utf-8", "replace"), n)
                if data:
                    self.send({"stream": name, "data": data})
        if not req.get("follow"):
            self.send({"end": True, "exitCode": p.exit_code})
            return
        while True:
            with _cond:
                if p.exit_code is None:
                    _cond.wait(1.0)
                chunks = []
                for name in ("stdout", "stderr"):
                    c = getattr(p, name)
                    new = min(c.total - sent[name], len(c.buf))
                    if new > 0:
                        chunks.append({"stream": name, "data": bytes(c.buf[len(c.buf) - new:]).decode("utf-8", "replace")})
                    sent[name] = c.total
                done = p.exit_code is not None and not p.stdout.thread.is_alive() and not p.stderr.thread.is_alive()
                code = p.exit_code
            for c in chunks:
                self.send(c)
            if done:
                self.send({"end": True, "exitCode": code})
                return
            if not chunks:
                self.send({"heartbeat": True})


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main():
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Thread(target=reaper, daemon=True).start()
    try:
        os.unlink(SOCKET)
    except FileNotFoundError:
        pass
    srv = Server(SOCKET, Handler)
    os.chmod(SOCKET, 0o600)
    lang = os.environ.get("PORTHOLE_SESSION_LANGUAGE")
    if lang in RUNNERS:
        threading.Thread(target=warm_up, args=(lang, {}), daemon=True).start()
    print("agent: serving on", SOCKET, flush=True)
    srv.serve_forever()


main()
