package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/porthole-dev/porthole/sandboxd/edgeapi"
	"github.com/porthole-dev/porthole/sandboxd/store"
)

func (ts *testServer) createSession(t *testing.T, key string, body map[string]any) string {
	t.Helper()
	code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/sessions", key, body)
	if code != 201 || out["status"] != "running" {
		t.Fatalf("create session: %d %v", code, out)
	}
	return out["id"].(string)
}

func (ts *testServer) execute(t *testing.T, id string, body map[string]any) map[string]any {
	t.Helper()
	code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/sessions/"+id+"/execute", ts.key, body)
	if code != 200 {
		t.Fatalf("execute: %d %v", code, out)
	}
	return out
}

// raw sends a request and returns status and body bytes.
func (ts *testServer) raw(t *testing.T, method, path, key string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestSessionExecutesShareFilesAndState(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	id := ts.createSession(t, ts.key, map[string]any{"language": "python", "metadata": map[string]any{"app": "test"}})
	out := ts.execute(t, id, map[string]any{"source": "open('data.txt', 'w').write('from python')\nstate['count'] = 1\nreturn 'ok'"})
	if out["ok"] != true || jsonOf(out["state"]) != `{"count":1}` {
		t.Fatalf("first execute: %v", out)
	}
	out = ts.execute(t, id, map[string]any{"language": "javascript", "source": "const fs = require('fs'); state.count += 1; return fs.readFileSync('/workspace/data.txt', 'utf8') + ' ' + state.count;"})
	if out["ok"] != true || out["result"] != "from python 2" || jsonOf(out["state"]) != `{"count":2}` {
		t.Fatalf("second execute (javascript): %v", out)
	}
	out = ts.execute(t, id, map[string]any{"source": "raise RuntimeError('boom')"})
	if out["ok"] != false || jsonOf(out["state"]) != `{"count":2}` {
		t.Fatalf("a failed execute must keep the state: %v", out)
	}
	out = ts.execute(t, id, map[string]any{"source": "return state['count']"})
	if jsonOf(out["result"]) != "2" {
		t.Fatalf("state after a failure: %v", out)
	}
	code, got, _ := ts.call(t, "GET", "/api/v1/sandbox/sessions/"+id, ts.key, nil)
	if code != 200 || jsonOf(got["metadata"]) != `{"app":"test"}` || got["previewAccess"] != "private" {
		t.Fatalf("get session: %d %v", code, got)
	}
}

// PoolOff disables the warm pool in tests that use sessions only.
var PoolOff = poolConfigOff()

func TestSessionOwnership(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	_, bobKey, err := ts.store.CreateKey(context.Background(), "bob")
	if err != nil {
		t.Fatal(err)
	}
	id := ts.createSession(t, ts.key, map[string]any{"language": "python", "threadId": "alice-thread"})
	base := "/api/v1/sandbox/sessions/" + id
	for _, c := range []struct{ method, path, body string }{
		{"GET", base, ""}, {"DELETE", base, ""}, {"POST", base + "/execute", `{"source":"return 1"}`},
		{"GET", base + "/files/", ""}, {"GET", base + "/files/a.txt", ""}, {"PUT", base + "/files/a.txt", "x"},
		{"DELETE", base + "/files/a.txt", ""}, {"POST", base + "/processes", `{"cmd":["sleep","1"]}`},
		{"GET", base + "/processes", ""}, {"GET", base + "/processes/1", ""}, {"DELETE", base + "/processes/1", ""},
		{"GET", base + "/processes/1/logs", ""}, {"GET", base + "/previews", ""},
		{"GET", "/api/v1/sandbox/threads/alice-thread", ""},
	} {
		code, body := ts.raw(t, c.method, c.path, bobKey, strings.NewReader(c.body))
		if code != 404 || !strings.Contains(string(body), `"not_found"`) {
			t.Errorf("bob %s %s: %d %s", c.method, c.path, code, body)
		}
	}
	code, out, _ := ts.call(t, "GET", "/api/v1/sandbox/sessions", bobKey, nil)
	if code != 200 || len(out["sessions"].([]any)) != 0 {
		t.Fatalf("bob's list: %v", out)
	}
	// Alice's session is untouched.
	if out := ts.execute(t, id, map[string]any{"source": "return 7"}); jsonOf(out["result"]) != "7" {
		t.Fatalf("alice after bob's attempts: %v", out)
	}
	code, out, _ = ts.call(t, "GET", "/api/v1/sandbox/sessions", ts.key, nil)
	if code != 200 || len(out["sessions"].([]any)) != 1 {
		t.Fatalf("alice's list: %v", out)
	}
}

func TestThreadStartIsIdempotent(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	var wg sync.WaitGroup
	ids := make([]string, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/threads/thread-42/start", ts.key, map[string]any{"language": "python"})
			if code != 200 && code != 201 {
				t.Errorf("start %d: %d %v", i, code, out)
				return
			}
			ids[i] = out["id"].(string)
		}()
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("four starts made different sandboxes: %v", ids)
		}
	}
	code, out, _ := ts.call(t, "GET", "/api/v1/sandbox/threads/thread-42", ts.key, nil)
	if code != 200 || out["id"] != ids[0] || out["threadId"] != "thread-42" {
		t.Fatalf("GET thread: %d %v", code, out)
	}
	if n := len(ts.rt.SessionIDs()); n != 1 {
		t.Fatalf("%d session sandboxes for one thread", n)
	}
	code, out, _ = ts.call(t, "GET", "/api/v1/sandbox/threads/no-such-thread", ts.key, nil)
	if code != 404 {
		t.Fatalf("unknown thread: %d %v", code, out)
	}
}

func TestPreviewThroughInternalForwarder(t *testing.T) {
	ts := newTestServer(t, Config{PreviewDomain: "preview.localhost", PreviewPort: 8443}, PoolOff)
	id := ts.createSession(t, ts.key, map[string]any{"language": "python"})
	code, body := ts.raw(t, "PUT", "/api/v1/sandbox/sessions/"+id+"/files/site/index.html", ts.key, strings.NewReader("hello from the sandbox"))
	if code != 201 {
		t.Fatalf("upload: %d %s", code, body)
	}
	code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/sessions/"+id+"/processes", ts.key,
		map[string]any{"cmd": []string{"python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"}, "cwd": "/workspace/site"})
	if code != 201 {
		t.Fatalf("start server: %d %v", code, out)
	}
	want := fmt.Sprintf("https://8000-%s.preview.localhost:8443/", id)
	var previews []any
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, out, _ = ts.call(t, "GET", "/api/v1/sandbox/sessions/"+id+"/previews", ts.key, nil)
		previews, _ = out["previews"].([]any)
		if len(previews) > 0 {
			break
		}
	}
	if len(previews) != 1 || previews[0].(map[string]any)["url"] != want || jsonOf(previews[0].(map[string]any)["port"]) != "8000" {
		t.Fatalf("previews = %v, want %s", previews, want)
	}

	// The edge's internal endpoint on a unix socket, as sandboxd serves it.
	sock := filepath.Join(t.TempDir(), "internal.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	internal := &http.Server{Handler: edgeapi.New(ts.api.log, ts.sessions, ts.rt, "preview.localhost", "")}
	go internal.Serve(ln)
	defer internal.Close()
	dial := func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, status, err := edgeapi.Dial(ctx, dial, "", id, 8000)
	if err != nil {
		t.Fatalf("forward: %d %v", status, err)
	}
	fmt.Fprintf(conn, "GET /index.html HTTP/1.0\r\nHost: 8000-%s.preview.localhost\r\n\r\n", id)
	resp, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.HasPrefix(string(resp), "HTTP/1.0 200") || !strings.HasSuffix(string(resp), "hello from the sandbox") {
		t.Fatalf("through the forwarder: %q", resp)
	}
	// Nothing listens on port 9 in the sandbox: refused, reported as such.
	if _, status, err := edgeapi.Dial(ctx, dial, "", id, 9); status != 502 || err == nil {
		t.Fatalf("port with nothing listening: %d %v", status, err)
	}
	if _, status, _ := edgeapi.Dial(ctx, dial, "", "nosuchsandboxnosuchsandbox", 8000); status != 404 {
		t.Fatalf("unknown sandbox: %d", status)
	}
	// The host's own 127.0.0.1:8000 is not the sandbox's.
	if c, err := net.DialTimeout("tcp", "127.0.0.1:8000", time.Second); err == nil {
		fmt.Fprintf(c, "GET /index.html HTTP/1.0\r\n\r\n")
		b, _ := io.ReadAll(c)
		c.Close()
		if strings.Contains(string(b), "hello from the sandbox") {
			t.Fatal("the sandbox's port answers on the host's loopback")
		}
	}
	// Resolve names the sandbox for a strict preview host, and nothing for a spoofed one.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) }}}
	for host, wantStatus := range map[string]int{
		"8000-" + id + ".preview.localhost":          200,
		"8000-" + id + ".preview.localhost.evil.com": 404,
		"08000-" + id + ".preview.localhost":         404,
		"8000-" + id + "x.preview.localhost":         404,
	} {
		resp, err := hc.Get("http://internal/internal/v1/resolve?host=" + host)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Errorf("resolve %s: %d, want %d", host, resp.StatusCode, wantStatus)
		}
	}
}

func TestFileAPIAttacks(t *testing.T) {
	ts := newTestServer(t, Config{MaxFileBytes: 1 << 20}, PoolOff)
	id := ts.createSession(t, ts.key, map[string]any{"language": "python"})
	base := "/api/v1/sandbox/sessions/" + id + "/files/"
	if code, b := ts.raw(t, "PUT", base+"dir/ok.txt", ts.key, strings.NewReader("fine")); code != 201 {
		t.Fatalf("upload: %d %s", code, b)
	}
	if code, b := ts.raw(t, "GET", base+"dir/ok.txt", ts.key, nil); code != 200 || string(b) != "fine" {
		t.Fatalf("download: %d %s", code, b)
	}
	if code, b := ts.raw(t, "GET", base+"dir", ts.key, nil); code != 200 || !strings.Contains(string(b), `"name":"ok.txt"`) {
		t.Fatalf("list: %d %s", code, b)
	}
	// The sandbox sees the upload, owned by its user, and makes a symlink to a host file.
	out := ts.execute(t, id, map[string]any{"source": "import os\nos.symlink('/etc/passwd', '/workspace/passwd')\nos.symlink('../../../../../../etc', '/workspace/etc')\nst = os.stat('/workspace/dir/ok.txt')\nreturn [open('/workspace/dir/ok.txt').read(), st.st_uid]"})
	if jsonOf(out["result"]) != `["fine",60000]` {
		t.Fatalf("the sandbox's view of the upload: %v", out)
	}
	marker := filepath.Join(t.TempDir(), "outside.txt")
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", base + "../../../../etc/passwd", 400},
		{"GET", base + "%2e%2e/%2e%2e/%2e%2e/etc/passwd", 400},
		{"GET", base + "dir/%2e%2e/%2e%2e/x", 400},
		{"GET", base + "/etc/passwd", 400},
		{"GET", base + "%2Fetc%2Fpasswd", 400},
		{"GET", base + "passwd", 400},
		{"GET", base + "etc/shadow", 400},
		{"PUT", base + "etc/evil", 400},
		{"PUT", base + "..%2F..%2F" + strings.TrimPrefix(marker, "/"), 400},
		{"PUT", base + "passwd", 201}, // replaces the link itself, inside the workspace
		{"DELETE", base + "../x", 400},
		{"GET", base + "nope.txt", 404},
	} {
		code, b := ts.raw(t, c.method, c.path, ts.key, strings.NewReader("evil"))
		if code != c.status || (c.status >= 400 && !strings.Contains(string(b), `"error"`)) {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, code, b, c.status)
		}
		if strings.Contains(string(b), "root:x:0:0") {
			t.Fatalf("%s %s leaked a host file", c.method, c.path)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a file was written outside the workspace")
	}
	if b, _ := os.ReadFile("/etc/passwd"); strings.Contains(string(b), "evil") {
		t.Fatal("/etc/passwd was written")
	}
	// Over the limit: refused, and the previous file is intact.
	code, b := ts.raw(t, "PUT", base+"dir/ok.txt", ts.key, strings.NewReader(strings.Repeat("x", 1<<20+1)))
	if code != 413 || !strings.Contains(string(b), `"too_large"`) {
		t.Fatalf("oversized upload: %d %s", code, b)
	}
	if code, b := ts.raw(t, "GET", base+"dir/ok.txt", ts.key, nil); code != 200 || string(b) != "fine" {
		t.Fatalf("after a refused upload: %d %s", code, b)
	}
	if code, _ := ts.raw(t, "DELETE", base+"dir", ts.key, nil); code != 204 {
		t.Fatalf("delete folder: %d", code)
	}
	if code, _ := ts.raw(t, "GET", base+"dir/ok.txt", ts.key, nil); code != 404 {
		t.Fatalf("after delete: %d", code)
	}
}

func TestProcessesAndLogs(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	id := ts.createSession(t, ts.key, map[string]any{"language": "python"})
	base := "/api/v1/sandbox/sessions/" + id + "/processes"
	code, p, _ := ts.call(t, "POST", base, ts.key, map[string]any{"cmd": []string{"sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo bad >&2; exit 3"}})
	if code != 201 {
		t.Fatalf("start: %d %v", code, p)
	}
	pid := jsonOf(p["pid"])
	// Follow live over a WebSocket until the process ends.
	wsURL := "ws" + strings.TrimPrefix(ts.URL, "http") + base + "/" + pid + "/logs"
	ws, resp, err := websocket.DefaultDialer.Dial(wsURL, http.Header{"x-api-key": {ts.key}})
	if err != nil {
		t.Fatalf("websocket: %v %v", err, resp)
	}
	var got strings.Builder
	var exit any
	for {
		var m map[string]any
		if err := ws.ReadJSON(&m); err != nil {
			break
		}
		if m["end"] == true {
			exit = m["exitCode"]
			break
		}
		got.WriteString(fmt.Sprint(m["data"]))
	}
	ws.Close()
	if !strings.Contains(got.String(), "line 1\nline 2\nline 3\n") || !strings.Contains(got.String(), "bad") || jsonOf(exit) != "3" {
		t.Fatalf("followed logs %q, exit %v", got.String(), exit)
	}
	code, logs, _ := ts.call(t, "GET", base+"/"+pid+"/logs?tail=1", ts.key, nil)
	if code != 200 || logs["stdout"] != "line 3\n" || logs["stderr"] != "bad\n" || jsonOf(logs["exitCode"]) != "3" {
		t.Fatalf("tail: %d %v", code, logs)
	}
	// A long-running one, stopped with a signal.
	_, p, _ = ts.call(t, "POST", base, ts.key, map[string]any{"cmd": []string{"sleep", "300"}})
	pid = jsonOf(p["pid"])
	if code, b := ts.raw(t, "DELETE", base+"/"+pid+"?signal=KILL", ts.key, nil); code != 204 {
		t.Fatalf("stop: %d %s", code, b)
	}
	var st map[string]any
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, st, _ = ts.call(t, "GET", base+"/"+pid, ts.key, nil)
		if st["state"] == "exited" {
			break
		}
	}
	if st["state"] != "exited" || jsonOf(st["exitCode"]) != "-9" {
		t.Fatalf("after SIGKILL: %v", st)
	}
	_, list, _ := ts.call(t, "GET", base, ts.key, nil)
	if n := len(list["processes"].([]any)); n != 2 {
		t.Fatalf("list: %v", list)
	}
	for _, bad := range []map[string]any{{"cmd": []string{}}, {"cmd": []string{"x"}, "cwd": "relative"}, {"cmd": "sh"}} {
		if code, out, _ := ts.call(t, "POST", base, ts.key, bad); code != 400 {
			t.Errorf("bad start %v: %d %v", bad, code, out)
		}
	}
	if code, out, _ := ts.call(t, "POST", base, ts.key, map[string]any{"cmd": []string{"/no/such/program"}}); code != 400 {
		t.Errorf("missing program: %d %v", code, out)
	}
	if code, _, _ := ts.call(t, "GET", base+"/99999", ts.key, nil); code != 404 {
		t.Errorf("unknown pid: %d", code)
	}
}

func TestIdleStopResumeAndDelete(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	ctx := context.Background()
	id := ts.createSession(t, ts.key, map[string]any{"language": "python", "idleTimeoutSec": 1})
	ts.execute(t, id, map[string]any{"source": "open('keep.txt','w').write('kept')\nreturn 1"})
	time.Sleep(1500 * time.Millisecond)
	if err := ts.sessions.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	_, out, _ := ts.call(t, "GET", "/api/v1/sandbox/sessions/"+id, ts.key, nil)
	if out["status"] != "stopped" || out["statusReason"] != "idle timeout" {
		t.Fatalf("after the idle timeout: %v", out)
	}
	if st, _, _ := ts.rt.SessionState(ctx, id); st != "" {
		t.Fatalf("runtime still %q after an idle stop", st)
	}
	// The next use resumes it, files intact.
	if out := ts.execute(t, id, map[string]any{"source": "return open('keep.txt').read()"}); out["result"] != "kept" {
		t.Fatalf("after resume: %v", out)
	}
	// Delete removes runtime, namespaces and files.
	if code, b := ts.raw(t, "DELETE", "/api/v1/sandbox/sessions/"+id, ts.key, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	if left := ts.rt.Remains(ctx, id); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
	if _, err := os.Stat(ts.rt.SessionDir(id)); !os.IsNotExist(err) {
		t.Fatalf("session files remain: %v", err)
	}
	if code, _, _ := ts.call(t, "GET", "/api/v1/sandbox/sessions/"+id, ts.key, nil); code != 404 {
		t.Fatalf("deleted session still answers %d", code)
	}
}

func TestDeletedOwnerIsReaped(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	ctx := context.Background()
	_, bobKey, _ := ts.store.CreateKey(ctx, "bob")
	bobs := ts.createSession(t, bobKey, map[string]any{"language": "python"})
	alices := ts.createSession(t, ts.key, map[string]any{"language": "python"})
	if err := ts.store.DeleteOwner(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if err := ts.sessions.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if left := ts.rt.Remains(ctx, bobs); len(left) > 0 {
		t.Fatalf("bob's sandbox survived the pass: %v", left)
	}
	if _, err := os.Stat(ts.rt.SessionDir(bobs)); !os.IsNotExist(err) {
		t.Fatalf("bob's files survived: %v", err)
	}
	// Alice's session, with a valid record, is untouched.
	if out := ts.execute(t, alices, map[string]any{"source": "return 1"}); out["ok"] != true {
		t.Fatalf("alice's session after the pass: %v", out)
	}
	if ts.sessions.Counts()["reaped_no_record"] != 1 {
		t.Fatalf("counts = %v", ts.sessions.Counts())
	}
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `porthole_session_actions_total{action="reaped_no_record"} 1`) {
		t.Fatalf("/metrics does not count the reaped sandbox")
	}
	ses, err := ts.store.GetSession(ctx, "alice", alices)
	if err != nil || ses.Status != store.StatusRunning {
		t.Fatalf("alice's record: %+v %v", ses, err)
	}
}
