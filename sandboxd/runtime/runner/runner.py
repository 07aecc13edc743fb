# Porthole's Python runner. It is the init process of one sandbox and serves exactly one run:
#   1. signal readiness by writing "R" to fd 3 (the result channel),
#   2. read one request {source, state} from stdin until EOF (EOF with no bytes means "exit"),
#   3. run `source` as the body of a function with `state` in scope,
#   4. write {ok, result|error, state} as one line of JSON to fd 3 and exit.
# print() goes to stdout, which sandboxd captures separately.
import ast
import json
import os
import sys
import traceback

# The answer channel: fd 3 in an ephemeral sandbox; a session's agent names another in the environment.
RESULT_FD = int(os.environ.pop("PORTHOLE_ANSWER_FD", "3"))


def _error(e):
    # Show the user's frames only: drop the runner's own frames from the top of the traceback.
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<source>":
        tb = tb.tb_next
    return {
        "type": type(e).__name__,
        "message": str(e),
        "stack": "".join(traceback.format_exception(type(e), e, tb)),
    }


def _answer(payload):
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as e:
        text = json.dumps({
            "ok": False,
            "error": {"type": "SerializationError",
                      "message": "result or state is not JSON-serialisable: " + str(e), "stack": ""},
            "state": None,
        })
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    # The newline ends the answer: sandboxd does not wait for EOF, which only comes once the runtime
    # process (which also holds this pipe) has exited. json.dumps never emits a raw newline.
    data = text.encode("utf-8") + b"\n"
    while data:
        n = os.write(RESULT_FD, data)
        data = data[n:]
    os.close(RESULT_FD)
    os._exit(0)


def _compile(source):
    # Parse the body as a module (a top-level `return` parses; only the compiler rejects it), then wrap
    # it in a function so `return` and `state` work, keeping the user's line numbers and string literals.
    module = ast.parse(source, filename="<source>", mode="exec")
    fn = ast.FunctionDef(
        name="__porthole_main__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg="state")], vararg=None, kwonlyargs=[],
                           kw_defaults=[], kwarg=None, defaults=[]),
        body=module.body or [ast.Pass()],
        decorator_list=[],
        returns=None,
    )
    if "type_params" in ast.FunctionDef._fields:  # Python 3.12+
        fn.type_params = []
    wrapper = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(wrapper)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(wrapper, "<source>", "exec"), scope)
    return scope["__porthole_main__"]


def main():
    # Warm up before declaring readiness: the first parse, compile and JSON round trip are slower.
    json.dumps(json.loads('{"warm": [1, "x", null]}'))
    _compile("return state")({})
    os.write(RESULT_FD, b"R")
    raw = sys.stdin.buffer.read()
    if not raw:
        os._exit(0)
    req = json.loads(raw)
    state = req.get("state")
    if state is None:
        state = {}
    try:
        fn = _compile(req["source"])
        result = fn(state)
    except BaseException as e:  # SystemExit and KeyboardInterrupt are the user's failures too
        _answer({"ok": False, "error": _error(e), "state": state})
    _answer({"ok": True, "result": result, "state": state})


main()
