package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// edge is a running bin/caddy with the root Caddyfile, in front of a sandboxd.
type edge struct {
	httpsAddr string
	dataHome  string // XDG_DATA_HOME of caddy: its CA and certificates
	roots     *x509.CertPool
	logs      *syncBuffer
	adminAddr string
	env       []string
}

// reload loads the same Caddyfile again through the admin API, as an operator's reload does.
func (e *edge) reload(t *testing.T) {
	t.Helper()
	cmd := exec.Command(binDir+"/caddy", "reload", "--config", "../Caddyfile", "--address", e.adminAddr, "--force")
	cmd.Env = e.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("reload: %v %s", err, out)
	}
}

// metric reads one sample of the edge's Prometheus metrics (Caddy's admin endpoint).
func (e *edge) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + e.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

func startEdge(t *testing.T, sandboxdDataDir string, env ...string) *edge {
	t.Helper()
	httpsAddr, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	_, httpsPort, _ := net.SplitHostPort(httpsAddr)
	_, httpPort, _ := net.SplitHostPort(httpAddr)
	home := t.TempDir()
	cmd := exec.Command(binDir+"/caddy", "run", "--config", "../Caddyfile")
	cmd.Env = append(os.Environ(),
		"PORTHOLE_HTTPS_PORT="+httpsPort, "PORTHOLE_HTTP_PORT="+httpPort, "PORTHOLE_ADMIN="+adminAddr,
		"PORTHOLE_PREVIEW_DOMAIN=preview.localhost", "PORTHOLE_DATA_DIR="+sandboxdDataDir,
		"XDG_DATA_HOME="+home+"/data", "XDG_CONFIG_HOME="+home+"/config")
	cmd.Env = append(cmd.Env, env...)
	logs := &syncBuffer{}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
		}
	}()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("caddy logs:\n%s", logs.String())
		}
	})
	e := &edge{httpsAddr: "127.0.0.1:" + httpsPort, dataHome: home + "/data", logs: logs, adminAddr: adminAddr, env: cmd.Env}
	rootPath := filepath.Join(e.dataHome, "caddy", "pki", "authorities", "local", "root.crt")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pem, err := os.ReadFile(rootPath); err == nil {
			e.roots = x509.NewCertPool()
			if e.roots.AppendCertsFromPEM(pem) {
				if c, err := net.Dial("tcp", e.httpsAddr); err == nil {
					c.Close()
					return e
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edge did not come up:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tlsConfig verifies against Caddy's local root; serverName is the SNI.
func (e *edge) tlsConfig(serverName string) *tls.Config {
	return &tls.Config{RootCAs: e.roots, ServerName: serverName}
}

// client dials the edge whatever the URL's host (names under .localhost need no resolver).
func (e *edge) client() *http.Client {
	return &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: e.roots},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, e.httpsAddr)
			},
			ForceAttemptHTTP2: true,
		},
	}
}

func (e *edge) url(host, path string) string {
	_, port, _ := net.SplitHostPort(e.httpsAddr)
	return "https://" + host + ":" + port + path
}

// certificates lists the hosts Caddy holds certificates for.
func (e *edge) certificates() []string {
	dirs, _ := filepath.Glob(filepath.Join(e.dataHome, "caddy", "certificates", "*", "*"))
	var hosts []string
	for _, d := range dirs {
		hosts = append(hosts, filepath.Base(d))
	}
	sort.Strings(hosts)
	return hosts
}

// startApp makes a public (or private) session serving testdata/server.js on 3000 and waits until
// the edge serves it.
func startApp(t *testing.T, d *daemon, key, name, access string) string {
	t.Helper()
	code, ses := post(t, d.url+"/api/v1/sandbox/sessions", key, `{"language":"javascript","previewAccess":"`+access+`"}`)
	if code != 201 {
		t.Fatalf("create: %d %v", code, ses)
	}
	id := ses["id"].(string)
	src, err := os.ReadFile("testdata/server.js")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("PUT", d.url+"/api/v1/sandbox/sessions/"+id+"/files/server.js", strings.NewReader(string(src)))
	req.Header.Set("x-api-key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("upload: %v %v", err, resp)
	}
	resp.Body.Close()
	if code, out := post(t, d.url+"/api/v1/sandbox/sessions/"+id+"/processes", key, `{"cmd":["node","server.js","`+name+`"]}`); code != 201 {
		t.Fatalf("start app: %d %v", code, out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, out := get(t, d.url+"/api/v1/sandbox/sessions/"+id+"/previews", key)
		if code == 200 && strings.Contains(fmt.Sprint(out["previews"]), "3000") {
			if _, err := os.Stat(filepath.Join(d.dataDir, "fwd", id+"-3000.sock")); err == nil {
				return id
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("app %s did not come up: %v", name, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func TestEdge(t *testing.T) {
	dataDir := t.TempDir()
	key := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice"))
	d := startDaemon(t, dataDir, "--pool-size", "0")
	e := startEdge(t, dataDir)
	a := startApp(t, d, key, "alpha", "public")
	b := startApp(t, d, key, "beta", "public")
	priv := startApp(t, d, key, "private", "private")
	hostA, hostB := "3000-"+a+".preview.localhost", "3000-"+b+".preview.localhost"
	c := e.client()

	t.Run("TLS verified against Caddy's local root", func(t *testing.T) {
		resp, err := c.Get(e.url(hostA, "/"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "hello from alpha" {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
		if resp.TLS == nil || resp.TLS.VerifiedChains == nil {
			t.Fatal("the connection was not verified")
		}
	})

	var wsA *websocket.Conn
	t.Run("WebSocket echo", func(t *testing.T) {
		dialer := websocket.Dialer{
			TLSClientConfig: e.tlsConfig(hostA),
			NetDialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, e.httpsAddr)
			},
		}
		ws, resp, err := dialer.Dial("wss://"+hostA+":"+strings.Split(e.httpsAddr, ":")[1]+"/ws", nil)
		if err != nil {
			t.Fatalf("dial: %v %v", err, resp)
		}
		for i := range 3 {
			msg := fmt.Sprintf("ping %d %s", i, strings.Repeat("x", i*70000))
			if err := ws.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			_, got, err := ws.ReadMessage()
			if err != nil || string(got) != msg {
				t.Fatalf("echo %d: %v (%d bytes)", i, err, len(got))
			}
		}
		wsA = ws
	})

	t.Run("SSE arrives event by event", func(t *testing.T) {
		resp, err := c.Get(e.url(hostA, "/sse"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "data: one\n" {
			t.Fatalf("first event: %q %v", line, err)
		}
		// The server sends "two" only once told to: reading "one" first proves nothing buffers.
		req, _ := http.NewRequest("PUT", d.url+"/api/v1/sandbox/sessions/"+a+"/files/go", strings.NewReader("go"))
		req.Header.Set("x-api-key", key)
		r2, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r2.Body.Close()
		rest, _ := io.ReadAll(br)
		if !strings.Contains(string(rest), "data: two") {
			t.Fatalf("second event: %q", rest)
		}
	})

	t.Run("forwarding headers and SNI never pick another sandbox", func(t *testing.T) {
		for _, h := range []http.Header{
			{"X-Forwarded-Host": {hostB}},
			{"Forwarded": {"host=" + hostB}},
			{"X-Forwarded-Host": {hostB}, "X-Forwarded-Proto": {"http"}, "X-Forwarded-For": {"10.0.0.1"}},
		} {
			req, _ := http.NewRequest("GET", e.url(hostA, "/"), nil)
			req.Header = h
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "hello from alpha" || strings.Contains(resp.Header.Get("X-Seen-Forwarded-Host"), b) || strings.Contains(resp.Header.Get("X-Seen-Forwarded"), b) {
				t.Fatalf("headers %v reached %q (seen XFH %q, Forwarded %q)", h, body, resp.Header.Get("X-Seen-Forwarded-Host"), resp.Header.Get("X-Seen-Forwarded"))
			}
		}
		// A TLS connection made for A's name, carrying a request with B's Host.
		conn, err := tls.Dial("tcp", e.httpsAddr, e.tlsConfig(hostA))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hostB)
		raw, _ := io.ReadAll(conn)
		conn.Close()
		if strings.Contains(string(raw), "hello from beta") || !strings.HasPrefix(string(raw), "HTTP/1.1 421") {
			t.Fatalf("SNI %s with Host %s: %q", hostA, hostB, firstLine(raw))
		}
	})

	t.Run("unknown, malformed, private and silent ports", func(t *testing.T) {
		for _, host := range []string{
			"3000-" + strings.Repeat("z", 26) + ".preview.localhost", // no such sandbox
			"03000-" + a + ".preview.localhost",                      // leading zero
			"70000-" + a + ".preview.localhost",                      // port out of range
			"x.3000-" + a + ".preview.localhost",                     // extra label
		} {
			if _, err := c.Get(e.url(host, "/")); err == nil {
				t.Errorf("%s: got an answer; want no certificate", host)
			}
		}
		resp, err := c.Get(e.url("3000-"+priv+".preview.localhost", "/"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || strings.Contains(string(body), "hello from") {
			t.Fatalf("private preview: %d %q", resp.StatusCode, body)
		}
		resp, err = c.Get(e.url("4000-"+a+".preview.localhost", "/"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "Waiting for port 4000") {
			t.Fatalf("port with nothing listening: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("1000 random SNI names issue no certificate", func(t *testing.T) {
		before := e.certificates()
		for i := range 1000 {
			name := fmt.Sprintf("%d-%s.preview.localhost", 1+i%65535, randomHex(13))
			if i%4 == 1 {
				name = randomHex(8) + ".preview.localhost"
			} else if i%4 == 2 {
				name = randomHex(6) + ".example.com"
			}
			conn, err := tls.Dial("tcp", e.httpsAddr, &tls.Config{ServerName: name, InsecureSkipVerify: true})
			if err == nil {
				conn.Close()
				t.Fatalf("a handshake for %s succeeded", name)
			}
		}
		after := e.certificates()
		if strings.Join(before, ",") != strings.Join(after, ",") {
			t.Fatalf("certificates changed: %v -> %v", before, after)
		}
		for _, h := range after {
			if h != hostA && h != hostB && h != "3000-"+priv+".preview.localhost" && h != "4000-"+a+".preview.localhost" && !strings.HasPrefix(h, "app.") {
				t.Errorf("a certificate for %s, which is no live sandbox's preview host", h)
			}
		}
	})

	t.Run("a flood of one unknown host asks sandboxd at most once per negative TTL", func(t *testing.T) {
		name := "3000-" + strings.Repeat("q", 26) + ".preview.localhost"
		before := e.metric(t, "porthole_edge_resolves_total")
		for range 500 {
			if conn, err := tls.Dial("tcp", e.httpsAddr, &tls.Config{ServerName: name, InsecureSkipVerify: true}); err == nil {
				conn.Close()
				t.Fatal("a handshake for an unknown sandbox succeeded")
			}
		}
		after := e.metric(t, "porthole_edge_resolves_total")
		if after-before < 1 || after-before > 2 {
			t.Fatalf("500 handshakes for one unknown host asked sandboxd %v times", after-before)
		}
		if e.metric(t, `porthole_edge_certificate_decisions_total{decision="denied"}`) < 500 {
			t.Fatal("denials are not counted")
		}
	})

	t.Run("a deleted session stops answering while another's WebSocket stays up", func(t *testing.T) {
		if wsA == nil {
			t.Skip("no WebSocket from the echo test")
		}
		req, _ := http.NewRequest("DELETE", d.url+"/api/v1/sandbox/sessions/"+b, nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 204 {
			t.Fatalf("delete: %v %v", err, resp)
		}
		resp.Body.Close()
		deleted := time.Now()
		for {
			resp, err := c.Get(e.url(hostB, "/"))
			gone := err != nil
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				gone = resp.StatusCode == 404 && !strings.Contains(string(body), "hello from beta")
			}
			if gone {
				break
			}
			if time.Since(deleted) > time.Second {
				t.Fatalf("%s still answers %v after its deletion", hostB, time.Since(deleted))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := wsA.WriteMessage(websocket.TextMessage, []byte("still here")); err != nil {
			t.Fatal(err)
		}
		if _, got, err := wsA.ReadMessage(); err != nil || string(got) != "still here" {
			t.Fatalf("A's WebSocket after B's deletion: %q %v", got, err)
		}
		wsA.Close()
		// Sandboxes coming and going need no config load: the only one so far is the start.
		if n := strings.Count(e.logs.String(), `autosaved config`); n != 1 {
			t.Fatalf("the edge loaded its config %d times:\n%s", n, e.logs.String())
		}
	})

	t.Run("metrics and the route table survive a config reload", func(t *testing.T) {
		before := e.metric(t, `porthole_edge_requests_total{outcome="proxied"}`)
		if before < 1 {
			t.Fatalf("proxied requests not counted: %v", before)
		}
		e.reload(t)
		if n := strings.Count(e.logs.String(), "autosaved config"); n != 2 {
			t.Fatalf("%d config loads after one reload, want 2 (the start and the reload)", n)
		}
		after := e.metric(t, `porthole_edge_requests_total{outcome="proxied"}`)
		if after < before {
			t.Fatalf("the counter went back from %v to %v across the reload", before, after)
		}
		resp, err := c.Get(e.url(hostA, "/"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello from alpha" {
			t.Fatalf("after the reload: %d %q", resp.StatusCode, body)
		}
		if e.metric(t, `porthole_edge_requests_total{outcome="proxied"}`) <= after {
			t.Fatal("requests after the reload are not counted")
		}
	})

}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\r\n")
	return s
}

// TestEdgeWakeAndUpstreamHost: a stopped sandbox is woken by a preview request behind a wait page;
// the upstream Host can be localhost:<port> for dev servers with host checks; the binary lists our
// modules.
func TestEdgeWakeAndUpstreamHost(t *testing.T) {
	out, err := exec.Command(binDir+"/caddy", "list-modules").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"http.reverse_proxy.upstreams.porthole", "tls.permission.porthole", "http.handlers.porthole_preview"} {
		if !strings.Contains(string(out), m+"\n") {
			t.Errorf("list-modules lacks %s", m)
		}
	}
	dataDir := t.TempDir()
	key := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice"))
	d := startDaemon(t, dataDir, "--pool-size", "0", "--reap-interval", "1s")
	e := startEdge(t, dataDir, "PORTHOLE_UPSTREAM_HOST=localhost")
	id := startApp(t, d, key, "sleepy", "public")
	host := "3000-" + id + ".preview.localhost"
	c := e.client()
	resp, err := c.Get(e.url(host, "/"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Seen-Host"); got != "localhost:3000" {
		t.Fatalf("the app saw Host %q, want localhost:3000", got)
	}
	// A session with a 1 s idle timeout: the maintenance pass (every second) stops it.
	id2 := func() string {
		code, ses := post(t, d.url+"/api/v1/sandbox/sessions", key, `{"language":"python","previewAccess":"public","idleTimeoutSec":1}`)
		if code != 201 {
			t.Fatalf("create: %d %v", code, ses)
		}
		return ses["id"].(string)
	}()
	host2 := "3000-" + id2 + ".preview.localhost"
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, ses := get(t, d.url+"/api/v1/sandbox/sessions/"+id2, key)
		if code == 200 && ses["status"] == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle session did not stop: %v", ses)
		}
		time.Sleep(200 * time.Millisecond)
	}
	resp, err = c.Get(e.url(host2, "/"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "Waking up") || !strings.Contains(string(body), `http-equiv="refresh"`) {
		t.Fatalf("stopped sandbox: %d %q", resp.StatusCode, body)
	}
	// The request woke it; once running, the edge answers "waiting for port" (its processes ended
	// with the stop) instead of the wake page.
	deadline = time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(e.url(host2, "/"))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "Waiting for port 3000") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the woken sandbox never came back")
		}
		time.Sleep(300 * time.Millisecond)
	}
}
