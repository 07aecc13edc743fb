package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func post(t *testing.T, url, key, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("x-api-key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("answer is not JSON: %q", raw)
	}
	return resp.StatusCode, out
}

// TestKeysAndServe covers the CLI contract: keys create prints the key last, the daemon serves it,
// and a revoked key stops working at once.
func TestKeysAndServe(t *testing.T) {
	dataDir := t.TempDir()
	out := sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice")
	key := lastLine(out)
	if !strings.HasPrefix(key, "ph_") {
		t.Fatalf("last line is not a key: %q", out)
	}
	list := sandboxdCmd(t, "keys", "list", "--data-dir", dataDir)
	keyID := strings.Split(strings.TrimPrefix(key, "ph_"), "_")[0]
	if !strings.Contains(list, keyID) || !strings.Contains(list, "alice") || strings.Contains(list, key) {
		t.Fatalf("keys list = %q", list)
	}
	d := startDaemon(t, dataDir, "--pool-size", "1")
	code, res := post(t, d.url+"/api/v1/sandbox/ephemeral", key, `{"language":"javascript","source":"return { ok: true, n: 1 + 1 };"}`)
	if code != 200 || res["ok"] != true {
		t.Fatalf("seed run: %d %v", code, res)
	}
	if r, _ := json.Marshal(res["result"]); string(r) != `{"n":2,"ok":true}` {
		t.Fatalf("result = %s", r)
	}
	sandboxdCmd(t, "keys", "revoke", "--data-dir", dataDir, keyID)
	if code, res := post(t, d.url+"/api/v1/sandbox/ephemeral", key, `{"language":"python","source":"return 1"}`); code != 401 {
		t.Fatalf("revoked key: %d %v", code, res)
	}
	if !strings.Contains(d.logs.String(), `"requestId"`) {
		t.Fatalf("logs carry no request id:\n%s", d.logs.String())
	}
}

// TestSIGTERMDrains: runs in flight finish, the daemon exits cleanly, and no sandbox is left.
func TestSIGTERMDrains(t *testing.T) {
	dataDir := t.TempDir()
	key := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice"))
	d := startDaemon(t, dataDir, "--pool-size", "2")
	type answer struct {
		code int
		out  map[string]any
	}
	done := make(chan answer, 3)
	for range 3 {
		go func() {
			code, out := post(t, d.url+"/api/v1/sandbox/ephemeral", key, `{"language":"python","source":"import time\ntime.sleep(1.5)\nreturn 'finished'"}`)
			done <- answer{code, out}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	stopped := make(chan struct{})
	go func() { d.stop(t); close(stopped) }()
	for range 3 {
		a := <-done
		if a.code != 200 || a.out["result"] != "finished" {
			t.Fatalf("run in flight during SIGTERM: %d %v", a.code, a.out)
		}
	}
	<-stopped
	if d.exitErr != nil {
		t.Fatalf("sandboxd exited with %v", d.exitErr)
	}
	if left := runcContainers(t, dataDir); left != "" {
		t.Fatalf("containers left after shutdown: %s", left)
	}
	if !strings.Contains(d.logs.String(), `"sandboxesAlive":0`) {
		t.Fatalf("shutdown did not report zero sandboxes:\n%s", d.logs.String())
	}
}

// TestOwnersDeleteReaps: `sandboxd owners delete` while the daemon runs; its next maintenance pass
// removes the owner's sandbox and leaves the other owner's alone.
func TestOwnersDeleteReaps(t *testing.T) {
	dataDir := t.TempDir()
	alice := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice"))
	bob := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "bob"))
	d := startDaemon(t, dataDir, "--pool-size", "0", "--reap-interval", "1s")
	_, a := post(t, d.url+"/api/v1/sandbox/sessions", alice, `{"language":"python"}`)
	_, b := post(t, d.url+"/api/v1/sandbox/sessions", bob, `{"language":"python"}`)
	aliceID, bobID := a["id"].(string), b["id"].(string)
	if out := sandboxdCmd(t, "owners", "delete", "--data-dir", dataDir, "bob"); !strings.Contains(out, "deleted owner bob") {
		t.Fatalf("owners delete: %q", out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for strings.Contains(runcContainers(t, dataDir), bobID) {
		if time.Now().After(deadline) {
			t.Fatalf("bob's sandbox still runs: %s", runcContainers(t, dataDir))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(runcContainers(t, dataDir), aliceID) {
		t.Fatal("alice's sandbox was reaped too")
	}
	if code, out := post(t, d.url+"/api/v1/sandbox/sessions/"+aliceID+"/execute", alice, `{"source":"return 5"}`); code != 200 || out["result"] != float64(5) {
		t.Fatalf("alice after the pass: %d %v", code, out)
	}
	if code, _ := post(t, d.url+"/api/v1/sandbox/sessions", bob, `{}`); code != 401 {
		t.Fatalf("bob's key after his deletion: %d", code)
	}
	if !strings.Contains(d.logs.String(), "reaped a runtime with no running session record") {
		t.Fatal("the reap is not logged")
	}
}
