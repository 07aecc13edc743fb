package runtime

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/porthole-dev/porthole/internal/testenv"
	"go.uber.org/zap/zaptest"
)

func newTestRuntime(t *testing.T) *Runtime {
	t.Helper()
	testenv.NeedRunc(t)
	rt, err := New(context.Background(), Config{Dir: t.TempDir(), CgroupParent: "porthole-test"}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

func run(t *testing.T, rt *Runtime, lang Language, src string, state string, timeout time.Duration) *RunResult {
	t.Helper()
	ctx := context.Background()
	sb, err := rt.Start(ctx, lang, rt.Limits())
	if err != nil {
		t.Fatal(err)
	}
	var st json.RawMessage
	if state != "" {
		st = json.RawMessage(state)
	}
	res, err := sb.Run(ctx, RunRequest{Source: src, State: st, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	<-sb.Done()
	return res
}

func TestRunBasics(t *testing.T) {
	rt := newTestRuntime(t)
	tests := []struct {
		name, src, state string
		lang             Language
		wantOK           bool
		wantResult       string
		wantState        string
		wantStdout       string
		wantErrType      string
	}{
		{name: "js seed", lang: JavaScript, src: `return { ok: true, n: 1 + 1 };`, wantOK: true, wantResult: `{"ok":true,"n":2}`},
		{name: "py seed", lang: Python, src: `return {"ok": True, "n": 1 + 1}`, wantOK: true, wantResult: `{"ok": true, "n": 2}`},
		{name: "js state and await", lang: JavaScript, src: "await new Promise(r => setTimeout(r, 5)); state.n += 1; console.log('hi'); return state.n;", state: `{"n":41}`, wantOK: true, wantResult: `42`, wantState: `{"n":42}`, wantStdout: "hi\n"},
		{name: "py state and print", lang: Python, src: "state['n'] += 1\nprint('hi')\nreturn state['n']", state: `{"n":41}`, wantOK: true, wantResult: `42`, wantState: `{"n": 42}`, wantStdout: "hi\n"},
		{name: "js exception", lang: JavaScript, src: `throw new TypeError("boom")`, wantErrType: "TypeError"},
		{name: "py exception", lang: Python, src: `raise ValueError("boom")`, wantErrType: "ValueError"},
		{name: "js process.exit", lang: JavaScript, src: `process.exit(3)`, wantErrType: "ProcessExited"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := run(t, rt, tc.lang, tc.src, tc.state, 10*time.Second)
			if res.OK != tc.wantOK {
				t.Fatalf("ok = %v, want %v (error %+v, stderr %q)", res.OK, tc.wantOK, res.Error, res.Stderr)
			}
			if tc.wantResult != "" && string(res.Result) != tc.wantResult {
				t.Errorf("result = %s, want %s", res.Result, tc.wantResult)
			}
			if tc.wantState != "" && string(res.State) != tc.wantState {
				t.Errorf("state = %s, want %s", res.State, tc.wantState)
			}
			if res.Stdout != tc.wantStdout {
				t.Errorf("stdout = %q, want %q", res.Stdout, tc.wantStdout)
			}
			if tc.wantErrType != "" {
				if res.Error == nil || res.Error.Type != tc.wantErrType {
					t.Fatalf("error = %+v, want type %s", res.Error, tc.wantErrType)
				}
				if tc.wantErrType != "ProcessExited" && !strings.Contains(res.Error.Stack, "boom") {
					t.Errorf("stack %q does not mention the message", res.Error.Stack)
				}
			}
		})
	}
}
