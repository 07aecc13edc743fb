package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/valyala/fasthttp"
)

// benchEdge measures, in one run on loopback, small responses through (a) the edge to a sandbox
// port, (b) Caddy's plain reverse_proxy to the same app on a host port, and (c) the app directly,
// plus WebSocket echo round trips through the edge and directly.
func benchEdge(caddyBin, dataDir, apiAddr, key string, dur time.Duration, conns int) error {
	tmp, err := os.MkdirTemp("", "porthole-bench-edge")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	port := func() string {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).AddrPort().String()
	}
	edgeAddr, plainAddr, hostApp := port(), port(), port()
	_, edgePort, _ := net.SplitHostPort(edgeAddr)
	_, plainPort, _ := net.SplitHostPort(plainAddr)
	_, hostAppPort, _ := net.SplitHostPort(hostApp)

	// The app: testdata/server.js, once in a public session (port 3000) and once on the host.
	src, err := os.ReadFile("e2e/testdata/server.js")
	if err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	api := func(method, path, body string) (map[string]any, error) {
		req, _ := http.NewRequest(method, "http://"+apiAddr+path, strings.NewReader(body))
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode >= 300 {
			return out, fmt.Errorf("%s %s: %d %v", method, path, resp.StatusCode, out)
		}
		return out, nil
	}
	ses, err := api("POST", "/api/v1/sandbox/sessions", `{"language":"javascript","previewAccess":"public"}`)
	if err != nil {
		return err
	}
	id := ses["id"].(string)
	if _, err := api("PUT", "/api/v1/sandbox/sessions/"+id+"/files/server.js", string(src)); err != nil {
		return err
	}
	if _, err := api("POST", "/api/v1/sandbox/sessions/"+id+"/processes", `{"cmd":["node","server.js","bench"]}`); err != nil {
		return err
	}
	hostNode := exec.Command("/usr/bin/node", "e2e/testdata/server.js", "bench", hostAppPort)
	if err := hostNode.Start(); err != nil {
		return err
	}
	defer hostNode.Process.Kill()

	// Two Caddy processes: the edge (root Caddyfile) and a plain reverse_proxy with the same TLS.
	plainCaddyfile := filepath.Join(tmp, "Caddyfile.plain")
	os.WriteFile(plainCaddyfile, []byte(fmt.Sprintf(`{
	admin off
	skip_install_trust
	https_port %s
	http_port %s
}
plain.localhost {
	tls internal
	reverse_proxy 127.0.0.1:%s
}
`, plainPort, port()[len("127.0.0.1:"):], hostAppPort)), 0o644)
	startCaddy := func(config, httpsPort, home string) (*exec.Cmd, error) {
		c := exec.Command(caddyBin, "run", "--config", config)
		c.Env = append(os.Environ(), "PORTHOLE_HTTPS_PORT="+httpsPort, "PORTHOLE_HTTP_PORT="+port()[len("127.0.0.1:"):],
			"PORTHOLE_ADMIN="+port(), "PORTHOLE_DATA_DIR="+dataDir, "PORTHOLE_PREVIEW_DOMAIN=preview.localhost",
			"XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
		return c, c.Start()
	}
	edgeHome, plainHome := filepath.Join(tmp, "edge"), filepath.Join(tmp, "plain")
	ec, err := startCaddy("Caddyfile", edgePort, edgeHome)
	if err != nil {
		return err
	}
	defer func() { ec.Process.Signal(os.Interrupt); ec.Wait() }()
	pc, err := startCaddy(plainCaddyfile, plainPort, plainHome)
	if err != nil {
		return err
	}
	defer func() { pc.Process.Signal(os.Interrupt); pc.Wait() }()

	edgeHost := "3000-" + id + ".preview.localhost"
	roots := func(home string) *x509.CertPool {
		for range 300 {
			if pem, err := os.ReadFile(filepath.Join(home, "caddy/pki/authorities/local/root.crt")); err == nil {
				p := x509.NewCertPool()
				p.AppendCertsFromPEM(pem)
				return p
			}
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}
	targets := []struct {
		name, addr, host string
		tls              *tls.Config
	}{
		{"(a) edge → sandbox port (TLS)", edgeAddr, edgeHost, &tls.Config{RootCAs: roots(edgeHome), ServerName: edgeHost}},
		{"(b) plain reverse_proxy → host port (TLS)", plainAddr, "plain.localhost", &tls.Config{RootCAs: roots(plainHome), ServerName: "plain.localhost"}},
		{"(c) the app directly (HTTP)", hostApp, "127.0.0.1", nil},
	}
	// Wait until each answers.
	for _, tg := range targets {
		var lastErr error
		for range 200 {
			if lastErr = fasthttpGet(tg.addr, tg.host, tg.tls); lastErr == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if lastErr != nil {
			return fmt.Errorf("%s does not answer: %w", tg.name, lastErr)
		}
	}
	// The machine is shared by the generator, Caddy, sandboxd and the apps: run the rows in rounds,
	// interleaved, and report each path's median round, so drift hits every path alike.
	const rounds = 3
	fmt.Printf("Edge benchmark: %d connections, %s per row, GET / (~20 bytes), median of %d interleaved rounds\n\n", conns, dur, rounds)
	results := make([][]*stats, len(targets))
	wrk, _ := exec.LookPath("wrk")
	if wrk != "" {
		// wrk (C) costs the shared cores far less than a Go TLS client. It resolves names through the
		// system, so the preview hosts get temporary /etc/hosts entries, removed afterwards.
		undo, err := addHosts(edgeHost, "plain.localhost")
		if err != nil {
			return err
		}
		defer undo()
		fmt.Println("Load generator: wrk (2 threads)")
	} else {
		fmt.Println("Load generator: fasthttp (wrk not installed)")
	}
	for range rounds {
		for i, tg := range targets {
			var s *stats
			if wrk != "" {
				s, err = wrkLoad(wrk, tg.addr, tg.host, tg.tls != nil, dur, conns)
				if err != nil {
					return err
				}
			} else {
				s = load(tg.addr, tg.host, tg.tls, dur, conns)
			}
			results[i] = append(results[i], s)
		}
	}
	fmt.Println()
	fmt.Println("| path | requests/s | p50 ms | p99 ms | errors |")
	fmt.Println("|---|---:|---:|---:|---:|")
	var rps []float64
	var p50s []time.Duration
	for i, tg := range targets {
		rs := results[i]
		sort.Slice(rs, func(a, b int) bool { return rs[a].throughput() < rs[b].throughput() })
		s := rs[len(rs)/2]
		rps = append(rps, s.throughput())
		p50s = append(p50s, s.pct(0.5))
		fmt.Printf("| %s | %.0f | %.2f | %.2f | %d |\n", tg.name, s.throughput(), ms(s.pct(0.5)), ms(s.pct(0.99)), s.errors)
	}
	// Diagnostic: sandboxd's per-port socket alone (no Caddy), to split the edge's cost.
	sock := filepath.Join(dataDir, "fwd", id+"-3000.sock")
	{
		hc := &fasthttp.HostClient{Addr: "sandbox", MaxConns: conns, Dial: func(string) (net.Conn, error) { return net.Dial("unix", sock) }}
		s := loadWith(hc, "sandbox", nil, dur, conns)
		fmt.Printf("| (d) sandboxd's port socket alone, no Caddy (HTTP) | %.0f | %.2f | %.2f | %d |\n", s.throughput(), ms(s.pct(0.5)), ms(s.pct(0.99)), s.errors)
	}
	fmt.Printf("\n(a)/(b) throughput: %.2f; p50 added by the edge over plain reverse_proxy: %.3f ms\n\n", rps[0]/rps[1], ms(p50s[0]-p50s[1]))

	fmt.Println("| WebSocket echo, 1 connection | round trips/s | p50 ms |")
	fmt.Println("|---|---:|---:|")
	for _, tg := range []struct {
		name, url string
		tls       *tls.Config
		addr      string
	}{
		{"through the edge", "wss://" + edgeHost + ":" + edgePort + "/ws", targets[0].tls, edgeAddr},
		{"directly", "ws://127.0.0.1:" + hostAppPort + "/ws", nil, hostApp},
	} {
		d := websocket.Dialer{TLSClientConfig: tg.tls, NetDialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, tg.addr)
		}}
		ws, _, err := d.Dial(tg.url, nil)
		if err != nil {
			return fmt.Errorf("websocket %s: %w", tg.name, err)
		}
		s := &stats{}
		start := time.Now()
		for time.Since(start) < dur {
			t0 := time.Now()
			if err := ws.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
				return err
			}
			if _, _, err := ws.ReadMessage(); err != nil {
				return err
			}
			s.lat = append(s.lat, time.Since(t0))
		}
		s.wall = time.Since(start)
		ws.Close()
		fmt.Printf("| %s | %.0f | %.3f |\n", tg.name, s.throughput(), ms(s.pct(0.5)))
	}
	_, _ = api("DELETE", "/api/v1/sandbox/sessions/"+id, "")
	return nil
}

func fasthttpClient(addr string, tc *tls.Config, conns int) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: addr, IsTLS: tc != nil, TLSConfig: tc, MaxConns: conns,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
}

func fasthttpGet(addr, host string, tc *tls.Config) error {
	c := fasthttpClient(addr, tc, 1)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(scheme(tc) + host + "/")
	req.SetHost(host)
	if err := c.Do(req, resp); err != nil {
		return err
	}
	if resp.StatusCode() != 200 || !strings.HasPrefix(string(resp.Body()), "hello from") {
		return fmt.Errorf("status %d", resp.StatusCode())
	}
	return nil
}

// load runs conns closed-loop clients for dur against addr.
func load(addr, host string, tc *tls.Config, dur time.Duration, conns int) *stats {
	return loadWith(fasthttpClient(addr, tc, conns), host, tc, dur, conns)
}

func loadWith(c *fasthttp.HostClient, host string, tc *tls.Config, dur time.Duration, conns int) *stats {
	s := &stats{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			var lat []time.Duration
			errs := 0
			for time.Since(start) < dur {
				req.SetRequestURI(scheme(tc) + host + "/")
				req.SetHost(host)
				t0 := time.Now()
				err := c.Do(req, resp)
				if err != nil || resp.StatusCode() != 200 {
					errs++
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			s.lat = append(s.lat, lat...)
			s.errors += errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	s.wall = time.Since(start)
	return s
}

func scheme(tc *tls.Config) string {
	if tc != nil {
		return "https://"
	}
	return "http://"
}

// addHosts maps names to 127.0.0.1 in /etc/hosts until the returned func runs.
func addHosts(names ...string) (func(), error) {
	const path = "/etc/hosts"
	orig, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var add strings.Builder
	for _, n := range names {
		fmt.Fprintf(&add, "127.0.0.1 %s # porthole-bench\n", n)
	}
	if err := os.WriteFile(path, append(append([]byte{}, orig...), add.String()...), 0o644); err != nil {
		return nil, fmt.Errorf("add bench names to %s (run as root): %w", path, err)
	}
	return func() { _ = os.WriteFile(path, orig, 0o644) }, nil
}

// wrkLoad runs wrk against host (resolved through /etc/hosts) and reads its throughput and latency
// percentiles. The 50% and 99% latencies fill stats.lat so pct(0.5) and pct(0.99) report them.
func wrkLoad(wrk, addr, host string, isTLS bool, dur time.Duration, conns int) (*stats, error) {
	_, port, _ := net.SplitHostPort(addr)
	url := "http://" + addr + "/"
	if isTLS {
		url = "https://" + host + ":" + port + "/"
	}
	out, err := exec.Command(wrk, "-t2", fmt.Sprintf("-c%d", conns), fmt.Sprintf("-d%ds", int(dur.Seconds())), "--latency", url).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("wrk %s: %v %s", url, err, out)
	}
	s := &stats{}
	var p50, p99 time.Duration
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "Requests/sec:":
			var r float64
			fmt.Sscan(f[1], &r)
			s.n = int(r)
		case len(f) == 2 && f[0] == "50%":
			p50, _ = time.ParseDuration(f[1])
		case len(f) == 2 && f[0] == "99%":
			p99, _ = time.ParseDuration(f[1])
		case len(f) >= 4 && f[0] == "Non-2xx":
			fmt.Sscan(f[len(f)-1], &s.errors)
		case strings.HasPrefix(line, "  Socket errors"):
			s.errors++
		}
	}
	s.measured = &measured{rps: float64(s.n), p50: p50, p99: p99}
	return s, nil
}
