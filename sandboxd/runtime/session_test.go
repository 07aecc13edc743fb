package runtime

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSessionLifecycle(t *testing.T) {
	rt := newTestRuntime(t)
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { _ = rt.RemoveSession(context.Background(), id) })
	if err := rt.StartSession(ctx, id, Python, rt.Limits()); err != nil {
		t.Fatal(err)
	}

	exec := func(lang Language, src, state string) *RunResult {
		t.Helper()
		var st json.RawMessage
		if state != "" {
			st = json.RawMessage(state)
		}
		res, err := rt.ExecuteInSession(ctx, id, lang, RunRequest{Source: src, State: st, Timeout: 10 * time.Second}, rt.Limits())
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := exec(Python, "open('/workspace/note.txt', 'w').write('hello')\nstate['n'] = 1\nprint('py')\nreturn 'written'", "")
	if !res.OK || string(res.Result) != `"written"` || res.Stdout != "py\n" {
		t.Fatalf("python execute: %+v %s", res.Error, res.Result)
	}
	res = exec(JavaScript, "const fs = require('fs'); state.n += 1; return fs.readFileSync('/workspace/note.txt', 'utf8') + ' ' + state.n;", string(res.State))
	if !res.OK || string(res.Result) != `"hello 2"` {
		t.Fatalf("javascript execute: %+v %s", res.Error, res.Result)
	}
	if b, err := os.ReadFile(filepath.Join(rt.WorkspacePath(id), "note.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("workspace on the host: %q %v", b, err)
	}
	res, err := rt.ExecuteInSession(ctx, id, Python, RunRequest{Source: "while True: pass", Timeout: time.Second}, rt.Limits())
	if err != nil || !res.TimedOut || res.Error.Type != "Timeout" {
		t.Fatalf("endless loop in a session: %+v %v", res, err)
	}
	if res = exec(Python, "return open('/workspace/note.txt').read()", ""); !res.OK {
		t.Fatalf("session unusable after a timeout: %+v", res.Error)
	}

	// A background server on the sandbox's loopback.
	var info map[string]any
	if err := rt.AgentCall(ctx, id, map[string]any{"op": "spawn", "cmd": []string{"/usr/bin/python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"}}, &info, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var ports []int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ports, _ = rt.ListeningPorts(ctx, id)
		if slices.Contains(ports, 8000) {
			break
		}
	}
	if !slices.Contains(ports, 8000) {
		t.Fatalf("listening ports = %v, want 8000", ports)
	}
	conn, err := rt.DialPort(ctx, id, 8000)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /note.txt HTTP/1.0\r\nHost: x\r\n\r\n")
	body, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.HasPrefix(string(body), "HTTP/1.0 200") || !strings.HasSuffix(string(body), "hello") {
		t.Fatalf("through the netns dial: %q", body)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:8000", time.Second); err == nil {
		// Something on the host answers 8000: it must not be the sandbox's server.
		fmt.Fprintf(c, "GET /note.txt HTTP/1.0\r\n\r\n")
		b, _ := io.ReadAll(bufio.NewReader(c))
		c.Close()
		if strings.HasSuffix(string(b), "hello") {
			t.Fatal("the sandbox's port is reachable from the host's loopback")
		}
	}

	// Stop keeps the workspace; a restart finds it.
	if err := rt.StopSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := rt.SessionState(ctx, id); st != "" {
		t.Fatalf("state after stop = %q", st)
	}
	if err := rt.StartSession(ctx, id, Python, rt.Limits()); err != nil {
		t.Fatal(err)
	}
	res = exec(Python, "return open('/workspace/note.txt').read()", "")
	if !res.OK || string(res.Result) != `"hello"` {
		t.Fatalf("after resume: %+v %s", res.Error, res.Result)
	}

	if err := rt.RemoveSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left := rt.Remains(ctx, id); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	if _, err := os.Stat(rt.SessionDir(id)); !os.IsNotExist(err) {
		t.Fatalf("session dir remains: %v", err)
	}
}
