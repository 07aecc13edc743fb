package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/porthole-dev/porthole/internal/testenv"
	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/session"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap/zaptest"
)

type testServer struct {
	*httptest.Server
	api      *Server
	rt       *runtime.Runtime
	pool     *runtime.Pool
	store    *store.Store
	key      string
	sessions *session.Manager
}

func newTestServer(t *testing.T, cfg Config, pool runtime.PoolConfig) *testServer {
	t.Helper()
	testenv.NeedRunc(t)
	ctx := context.Background()
	dir := t.TempDir()
	log := zaptest.NewLogger(t)
	st, err := store.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.New(ctx, runtime.Config{Dir: dir + "/runtime", CgroupParent: "porthole-apitest"}, log)
	if err != nil {
		t.Fatal(err)
	}
	p := runtime.NewPool(rt, pool, log)
	sessions := session.New(session.Config{}, log, st, rt)
	srv := New(cfg, log, st, rt, p, sessions)
	hs := httptest.NewServer(srv)
	_, key, err := st.CreateKey(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hs.Close()
		p.Close()
		for _, id := range rt.SessionIDs() {
			_ = rt.RemoveSession(context.Background(), id)
		}
		rt.Close()
		st.Close()
	})
	return &testServer{Server: hs, api: srv, rt: rt, pool: p, store: st, key: key, sessions: sessions}
}

// call sends a request with the test key and decodes the JSON answer.
func (ts *testServer) call(t *testing.T, method, path, key string, body any) (int, map[string]any, http.Header) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, ts.URL+path, rd)
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: answer is not JSON (%d): %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out, resp.Header
}

func (ts *testServer) ephemeral(t *testing.T, body any) (int, map[string]any) {
	t.Helper()
	code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/ephemeral", ts.key, body)
	return code, out
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestEphemeralContract(t *testing.T) {
	ts := newTestServer(t, Config{}, runtime.PoolConfig{Size: 2})
	tests := []struct {
		name                           string
		body                           map[string]any
		ok                             bool
		result, state, stdout, errType string
	}{
		{name: "js seed", body: map[string]any{"language": "javascript", "source": "return { ok: true, n: 1 + 1 };"}, ok: true, result: `{"n":2,"ok":true}`},
		{name: "py seed", body: map[string]any{"language": "python", "source": `return {"ok": True, "n": 1 + 1}`}, ok: true, result: `{"n":2,"ok":true}`},
		{name: "js state await log", body: map[string]any{"language": "javascript", "source": "await new Promise(r => setTimeout(r, 1)); console.log('count', state.count); state.count++; return state.count;", "state": map[string]any{"count": 1}},
			ok: true, result: "2", state: `{"count":2}`, stdout: "count 1\n"},
		{name: "py state print", body: map[string]any{"language": "python", "source": "print('count', state['count'])\nstate['count'] += 1\nreturn state['count']", "state": map[string]any{"count": 1}},
			ok: true, result: "2", state: `{"count":2}`, stdout: "count 1\n"},
		{name: "js exception", body: map[string]any{"language": "javascript", "source": "throw new RangeError('nope')"}, errType: "RangeError"},
		{name: "py exception", body: map[string]any{"language": "python", "source": "1/0"}, errType: "ZeroDivisionError"},
		{name: "py syntax error", body: map[string]any{"language": "python", "source": "def ("}, errType: "SyntaxError"},
		{name: "js no return", body: map[string]any{"language": "javascript", "source": "1 + 1;"}, ok: true, result: "null", state: "{}"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := ts.ephemeral(t, tc.body)
			if code != 200 {
				t.Fatalf("status %d: %v", code, out)
			}
			if out["ok"] != tc.ok {
				t.Fatalf("ok = %v: %v", out["ok"], out)
			}
			for _, f := range []string{"id", "ok", "result", "stdout", "stderr", "durationMs", "timedOut", "error", "state"} {
				if _, present := out[f]; !present {
					t.Errorf("answer lacks %q: %v", f, out)
				}
			}
			if tc.result != "" && jsonOf(out["result"]) != tc.result {
				t.Errorf("result = %s, want %s", jsonOf(out["result"]), tc.result)
			}
			if tc.state != "" && jsonOf(out["state"]) != tc.state {
				t.Errorf("state = %s, want %s", jsonOf(out["state"]), tc.state)
			}
			if out["stdout"] != tc.stdout {
				t.Errorf("stdout = %q, want %q", out["stdout"], tc.stdout)
			}
			if tc.errType != "" {
				e, _ := out["error"].(map[string]any)
				if e == nil || e["type"] != tc.errType || e["message"] == "" {
					t.Fatalf("error = %v, want type %s", out["error"], tc.errType)
				}
				if tc.errType != "SyntaxError" && e["stack"] == "" {
					t.Errorf("no stack: %v", e)
				}
			} else if out["error"] != nil {
				t.Errorf("error = %v, want null", out["error"])
			}
		})
	}
}

func TestEphemeralTimeout(t *testing.T) {
	ts := newTestServer(t, Config{}, runtime.PoolConfig{Size: 1})
	code, out := ts.ephemeral(t, map[string]any{"language": "javascript", "source": "while (true) {}", "timeoutMs": 20001})
	if code != 400 || out["error"].(map[string]any)["code"] != "invalid_argument" {
		t.Fatalf("timeoutMs 20001: %d %v", code, out)
	}
	for _, lang := range []string{"javascript", "python"} {
		src := "while (true) {}"
		if lang == "python" {
			src = "while True:\n    pass"
		}
		start := time.Now()
		code, out = ts.ephemeral(t, map[string]any{"language": lang, "source": src, "timeoutMs": 1000})
		took := time.Since(start)
		if code != 200 || out["timedOut"] != true || out["ok"] != false {
			t.Fatalf("%s endless loop: %d %v", lang, code, out)
		}
		t.Logf("%s endless loop with timeoutMs 1000 answered in %v", lang, took)
		waitGone(t, ts.rt, out["id"].(string))
	}
}

// waitGone waits until nothing of sandbox id remains on the host.
func waitGone(t *testing.T, rt *runtime.Runtime, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := rt.Remains(context.Background(), id)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s left behind: %v", id, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAuth(t *testing.T) {
	ts := newTestServer(t, Config{}, runtime.PoolConfig{})
	ctx := context.Background()
	k, revoked, err := ts.store.CreateKey(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.store.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"language": "python", "source": "open('/tmp/ran','w'); return 1"}
	for name, key := range map[string]string{"missing": "", "wrong": ts.key + "x", "garbage": "hello", "revoked": revoked} {
		code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/ephemeral", key, body)
		if code != 401 || out["error"].(map[string]any)["code"] != "unauthenticated" || out["error"].(map[string]any)["requestId"] == "" {
			t.Errorf("%s key: %d %v", name, code, out)
		}
	}
	code, _, _ := ts.call(t, "GET", "/api/v1/openapi.json", "", nil)
	if code != 401 {
		t.Errorf("openapi without key: %d", code)
	}
	for _, owner := range []string{"alice", "bob"} {
		runs, err := ts.store.Runs(ctx, owner, 10)
		if err != nil || len(runs) != 0 {
			t.Fatalf("%s has runs after refused requests: %v %v", owner, runs, err)
		}
	}
	// And a good key works, and its run is recorded against its owner.
	if code, out := ts.ephemeral(t, body); code != 200 || out["ok"] != true {
		t.Fatalf("good key: %d %v", code, out)
	}
	runs, _ := ts.store.Runs(ctx, "alice", 10)
	if len(runs) != 1 || runs[0].Language != "python" || runs[0].Outcome != "ok" {
		t.Fatalf("run log = %+v", runs)
	}
}

func TestBadRequests(t *testing.T) {
	ts := newTestServer(t, Config{}, runtime.PoolConfig{})
	big := strings.Repeat("x", 256<<10+1)
	bigState := `{"s":"` + strings.Repeat("x", 256<<10) + `"}`
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		msg    string
	}{
		{"malformed JSON", `{"language": "python", "source": `, 400, "invalid_argument", "malformed JSON"},
		{"not an object", `[1,2]`, 400, "invalid_argument", ""},
		{"empty body", ``, 400, "invalid_argument", "empty"},
		{"trailing data", `{"language":"python","source":"return 1"} {}`, 400, "invalid_argument", "after the JSON"},
		{"unknown field", `{"language":"python","source":"return 1","sauce":1}`, 400, "invalid_argument", "sauce"},
		{"unknown language", `{"language":"ruby","source":"1"}`, 400, "invalid_argument", "ruby"},
		{"missing language", `{"source":"1"}`, 400, "invalid_argument", "language"},
		{"empty source", `{"language":"python","source":"  \n"}`, 400, "invalid_argument", "source"},
		{"missing source", `{"language":"python"}`, 400, "invalid_argument", "source"},
		{"source wrong type", `{"language":"python","source":42}`, 400, "invalid_argument", "source"},
		{"source too big", `{"language":"python","source":"` + big + `"}`, 400, "invalid_argument", "limit is 262144"},
		{"state too big", `{"language":"python","source":"return 1","state":` + bigState + `}`, 400, "invalid_argument", "limit is 262144"},
		{"state not object", `{"language":"python","source":"return 1","state":[1]}`, 400, "invalid_argument", "state"},
		{"timeout zero", `{"language":"python","source":"return 1","timeoutMs":0}`, 400, "invalid_argument", "timeoutMs"},
		{"timeout negative", `{"language":"python","source":"return 1","timeoutMs":-5}`, 400, "invalid_argument", "timeoutMs"},
		{"timeout over max", `{"language":"python","source":"return 1","timeoutMs":20001}`, 400, "invalid_argument", "20000"},
		{"timeout float", `{"language":"python","source":"return 1","timeoutMs":1.5}`, 400, "invalid_argument", "timeoutMs"},
		{"threadId too long", `{"language":"python","source":"return 1","threadId":"` + strings.Repeat("t", 129) + `"}`, 400, "invalid_argument", "threadId"},
		{"body too big", `{"language":"python","source":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "too_large", "exceeds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, _ := ts.call(t, "POST", "/api/v1/sandbox/ephemeral", ts.key, tc.body)
			e, _ := out["error"].(map[string]any)
			if code != tc.status || e == nil || e["code"] != tc.code || !strings.Contains(fmt.Sprint(e["message"]), tc.msg) || e["requestId"] == "" {
				t.Fatalf("got %d %v, want %d %s mentioning %q", code, out, tc.status, tc.code, tc.msg)
			}
		})
	}
	if n := ts.rt.Alive(); n != 0 {
		t.Fatalf("%d sandboxes started for bad requests", n)
	}
	code, out, h := ts.call(t, "GET", "/api/v1/sandbox/ephemeral", ts.key, nil)
	if code != 405 || h.Get("Allow") != "POST" || out["error"] == nil {
		t.Fatalf("GET ephemeral: %d %v", code, out)
	}
	code, out, _ = ts.call(t, "GET", "/api/v1/nope", ts.key, nil)
	if code != 404 || out["error"].(map[string]any)["code"] != "not_found" {
		t.Fatalf("unknown route: %d %v", code, out)
	}
}

// TestBurst sends 100 runs at once: each gets a result or a 429, never a 5xx, and afterwards nothing
// of any of them remains.
func TestBurst(t *testing.T) {
	ts := newTestServer(t, Config{MaxParallelRuns: 4, MaxQueuedRuns: 8}, runtime.PoolConfig{Size: 2})
	const n = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[int]int{}
	var ids []string
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lang, src := "javascript", fmt.Sprintf("return %d * 2;", i)
			if i%2 == 1 {
				lang, src = "python", fmt.Sprintf("return %d * 2", i)
			}
			j, _ := json.Marshal(map[string]any{"language": lang, "source": src})
			req, _ := http.NewRequest("POST", ts.URL+"/api/v1/sandbox/ephemeral", bytes.NewReader(j))
			req.Header.Set("x-api-key", ts.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Errorf("decode: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			counts[resp.StatusCode]++
			switch resp.StatusCode {
			case 200:
				if out["ok"] != true || jsonOf(out["result"]) != fmt.Sprint(i*2) {
					t.Errorf("run %d: %v", i, out)
				}
				ids = append(ids, out["id"].(string))
			case 429:
				if resp.Header.Get("Retry-After") == "" || out["error"].(map[string]any)["code"] != "rate_limited" {
					t.Errorf("429 without Retry-After or error model: %v", out)
				}
			default:
				t.Errorf("run %d: status %d: %v", i, resp.StatusCode, out)
			}
		}()
	}
	wg.Wait()
	t.Logf("status counts: %v", counts)
	if counts[200] == 0 {
		t.Fatal("no run succeeded")
	}
	for _, id := range ids {
		waitGone(t, ts.rt, id)
	}
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	ts := newTestServer(t, Config{}, runtime.PoolConfig{})
	code, doc, _ := ts.call(t, "GET", "/api/v1/openapi.json", ts.key, nil)
	if code != 200 || doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi: %d %v", code, doc["openapi"])
	}
	documented := map[string]bool{}
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			if method == "parameters" {
				continue
			}
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	served := map[string]bool{}
	for _, r := range ts.api.Routes() {
		key := r.Method + " " + strings.ReplaceAll(r.Path, "...}", "}") // Go's {path...} is OpenAPI's {path}
		served[key] = true
		if !documented[key] {
			t.Errorf("route %s %s is not in openapi.json", r.Method, r.Path)
		}
	}
	for k := range documented {
		if !served[k] {
			t.Errorf("openapi.json documents %s, which is not served", k)
		}
	}
}

func TestMetricsAndHealth(t *testing.T) {
	ts := newTestServer(t, Config{}, runtime.PoolConfig{})
	if code, out := ts.ephemeral(t, map[string]any{"language": "python", "source": "return 1"}); code != 200 || out["ok"] != true {
		t.Fatalf("run: %d %v", code, out)
	}
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`porthole_runs_total{language="python",outcome="ok"} 1`,
		`porthole_run_duration_seconds_count{language="python"} 1`,
		"porthole_run_queue_depth 0", "porthole_sandboxes_alive", `porthole_warm_sandboxes{language="javascript"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	code, out, h := ts.call(t, "GET", "/healthz", "", nil)
	if code != 200 || out["status"] != "ok" || h.Get("X-Request-Id") == "" {
		t.Fatalf("healthz: %d %v", code, out)
	}
}

func poolConfigOff() runtime.PoolConfig { return runtime.PoolConfig{} }
