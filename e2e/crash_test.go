package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/edgeapi"
	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/store"
)

func get(t *testing.T, url, key string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("x-api-key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

// TestCrashRestart kills sandboxd with SIGKILL in the middle of a burst of creates and executes,
// restarts it, and checks that within one reap interval the runtimes alive are exactly the running
// sessions of the store, that every one of them executes and keeps its processes and ports, and that
// nothing of the others remains.
func TestCrashRestart(t *testing.T) {
	dataDir := t.TempDir()
	key := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice"))
	const reap = 2 * time.Second
	d := startDaemon(t, dataDir, "--pool-size", "1", "--reap-interval", reap.String())

	// A session with a server on its loopback, which must survive the crash.
	code, ses := post(t, d.url+"/api/v1/sandbox/sessions", key, `{"language":"python"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, ses)
	}
	server := ses["id"].(string)
	if code, out := post(t, d.url+"/api/v1/sandbox/sessions/"+server+"/execute", key, `{"source":"open('index.html','w').write('survivor')\nreturn 1"}`); code != 200 || out["ok"] != true {
		t.Fatalf("execute: %d %v", code, out)
	}
	if code, out := post(t, d.url+"/api/v1/sandbox/sessions/"+server+"/processes", key, `{"cmd":["python3","-m","http.server","8000","--bind","127.0.0.1"]}`); code != 201 {
		t.Fatalf("start server: %d %v", code, out)
	}

	// The burst.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var created atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				body := fmt.Sprintf(`{"language":"python","metadata":{"worker":%d,"i":%d}}`, w, i)
				req, _ := http.NewRequest("POST", d.url+"/api/v1/sandbox/sessions", strings.NewReader(body))
				req.Header.Set("x-api-key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the daemon died
				}
				var out map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if id, ok := out["id"].(string); ok {
					created.Add(1)
					req, _ := http.NewRequest("POST", d.url+"/api/v1/sandbox/sessions/"+id+"/execute", strings.NewReader(`{"source":"return 2"}`))
					req.Header.Set("x-api-key", key)
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				}
			}
		}()
	}
	time.Sleep(2500 * time.Millisecond)
	_ = d.cmd.Process.Kill() // SIGKILL: no drain, no cleanup
	d.stop(t)
	stop.Store(true)
	wg.Wait()
	t.Logf("sessions created before the crash: %d", created.Load())

	d2 := startDaemon(t, dataDir, "--pool-size", "1", "--reap-interval", reap.String())
	time.Sleep(reap + time.Second)

	st, err := store.Open(context.Background(), dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	all, err := st.ListSessions(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	var running, others []string
	for _, s := range all {
		if s.Status == store.StatusRunning {
			running = append(running, s.ID)
		} else {
			others = append(others, s.ID+":"+s.Status)
		}
	}
	sort.Strings(running)
	// Runtimes alive: session containers in the runtime root, minus the new daemon's warm pool
	// (ephemeral sandboxes, which have no session directory).
	var alive []string
	for _, id := range strings.Fields(runcContainers(t, dataDir)) {
		if _, err := os.Stat(filepath.Join(dataDir, "runtime", "s", id)); err == nil {
			alive = append(alive, id)
		}
	}
	sort.Strings(alive)
	if strings.Join(alive, ",") != strings.Join(running, ",") {
		t.Fatalf("runtimes alive %v != running sessions %v (others: %v)", alive, running, others)
	}
	if len(running) == 0 || !contains(running, server) {
		t.Fatalf("the server session did not survive: running %v", running)
	}
	t.Logf("after restart: %d running sessions, other records: %v", len(running), others)

	for _, id := range running {
		code, out := post(t, d2.url+"/api/v1/sandbox/sessions/"+id+"/execute", key, `{"source":"return 40 + 2"}`)
		if code != 200 || fmt.Sprint(out["result"]) != "42" {
			t.Fatalf("session %s after restart: %d %v", id, code, out)
		}
	}
	// The background server kept running, and its port is reachable through the new daemon.
	code, procs := get(t, d2.url+"/api/v1/sandbox/sessions/"+server+"/processes", key)
	if code != 200 || !strings.Contains(fmt.Sprint(procs["processes"]), "running") {
		t.Fatalf("processes after restart: %d %v", code, procs)
	}
	sock := filepath.Join(dataDir, "internal.sock")
	dial := func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, status, err := edgeapi.Dial(ctx, dial, "", server, 8000)
	if err != nil {
		t.Fatalf("forward after restart: %d %v", status, err)
	}
	fmt.Fprintf(conn, "GET /index.html HTTP/1.0\r\n\r\n")
	body, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.HasSuffix(string(body), "survivor") {
		t.Fatalf("server after restart: %q", body)
	}
	// Nothing remains of sessions that did not survive, nor of the dead daemon's ephemeral sandboxes.
	known := map[string]bool{}
	for _, id := range alive {
		known[id] = true
	}
	entries, _ := os.ReadDir(filepath.Join(dataDir, "runtime", "s"))
	for _, e := range entries {
		if !known[e.Name()] {
			t.Errorf("session files of %s remain", e.Name())
		}
	}
	for _, s := range all {
		if s.Status != store.StatusRunning {
			if tr := runtime.HostTraces(s.ID); len(tr) > 0 {
				t.Errorf("session %s (%s) left %v", s.ID, s.Status, tr)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
