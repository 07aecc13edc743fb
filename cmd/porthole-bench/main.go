// Command porthole-bench measures ephemeral runs through sandboxd's API side by side with a bare start
// of the same interpreter on the same machine, and prints a Markdown table for docs/PERFORMANCE.md.
//
// It starts bin/sandboxd on a fresh data dir, creates a key, and for each language measures:
//   - bare: `node -e` / `python3 -c` of the program, back to back (concurrency 1) and 8 at a time;
//   - api:  POST /api/v1/sandbox/ephemeral with the same program, concurrency 1 and 8;
//   - api paced: concurrency 1 with a pause between runs, so the warm pool is full when a run arrives,
//     which is the latency an interactive caller sees.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	sbruntime "github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

type program struct {
	lang       string
	source     string   // function body for the API
	bare       []string // argv of the bare start
	wantResult string
}

var programs = []program{
	{lang: "javascript", source: "return 1 + 1;", bare: []string{"/usr/bin/node", "-e", "console.log(JSON.stringify(1 + 1))"}, wantResult: "2"},
	{lang: "python", source: "return 1 + 1", bare: []string{"/usr/bin/python3", "-c", "import json; print(json.dumps(1 + 1))"}, wantResult: "2"},
}

type stats struct {
	name        string
	n           int
	concurrency int
	lat         []time.Duration
	wall        time.Duration
	errors      int
	// measured, when set, holds what an external generator (wrk) reported instead of samples.
	measured *measured
}

type measured struct {
	rps      float64
	p50, p99 time.Duration
}

func (s *stats) pct(p float64) time.Duration {
	if s.measured != nil {
		if p >= 0.99 {
			return s.measured.p99
		}
		return s.measured.p50
	}
	if len(s.lat) == 0 {
		return 0
	}
	l := slices.Clone(s.lat)
	slices.Sort(l)
	i := int(p * float64(len(l)-1))
	return l[i]
}

func (s *stats) throughput() float64 {
	if s.measured != nil {
		return s.measured.rps
	}
	return float64(len(s.lat)) / s.wall.Seconds()
}

// measure runs op n times with the given concurrency; pause is slept between runs of one worker.
func measure(name string, n, concurrency int, pause time.Duration, op func() error) *stats {
	s := &stats{name: name, n: n, concurrency: concurrency}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				t0 := time.Now()
				err := op()
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					s.errors++
					if s.errors <= 3 {
						fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
					}
				} else {
					s.lat = append(s.lat, d)
				}
				mu.Unlock()
				time.Sleep(pause)
			}
		}()
	}
	wg.Wait()
	s.wall = time.Since(start)
	return s
}

type edgeConfig struct {
	on    bool
	dur   time.Duration
	conns int
}

var benchEdgeCfg edgeConfig

func main() {
	sandboxd := flag.String("sandboxd", "bin/sandboxd", "sandboxd binary")
	n := flag.Int("n", 100, "runs per measurement")
	pause := flag.Duration("pause", 250*time.Millisecond, "pause between paced runs")
	poolSize := flag.Int("pool-size", 4, "warm sandboxes per language")
	sessions := flag.Int("sessions", 0, "measure durable sessions instead, holding up to this many idle ones")
	edge := flag.Bool("edge", false, "measure the preview edge instead (needs bin/caddy)")
	edgeDur := flag.Duration("edge-duration", 5*time.Second, "duration of each edge row")
	edgeConns := flag.Int("edge-conns", 16, "connections of the edge load generator")
	flag.Parse()
	benchEdgeCfg = edgeConfig{on: *edge, dur: *edgeDur, conns: *edgeConns}
	if err := run(*sandboxd, *n, *pause, *poolSize, *sessions); err != nil {
		fmt.Fprintln(os.Stderr, "porthole-bench:", err)
		os.Exit(1)
	}
}

func run(bin string, n int, pause time.Duration, poolSize, sessions int) error {
	dataDir, err := os.MkdirTemp("", "porthole-bench")
	if err != nil {
		return err
	}
	defer func() {
		// Sessions outlive sandboxd by design: remove what is left, then the data dir.
		root := filepath.Join(dataDir, "runtime", "state")
		if out, err := exec.Command("runc", "--root", root, "list", "-q").Output(); err == nil {
			for _, id := range strings.Fields(string(out)) {
				_ = exec.Command("runc", "--root", root, "delete", "--force", id).Run()
			}
		}
		ws, _ := filepath.Glob(filepath.Join(dataDir, "runtime", "s", "*", "workspace"))
		for _, w := range ws {
			_ = syscall.Unmount(w, syscall.MNT_DETACH)
		}
		os.RemoveAll(dataDir)
	}()
	out, err := exec.Command(bin, "keys", "create", "--data-dir", dataDir, "--owner", "bench").Output()
	if err != nil {
		return fmt.Errorf("create key (is %s built? run make build): %w", bin, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	key := lines[len(lines)-1]

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	daemon := exec.Command(bin, "serve", "--listen", addr, "--data-dir", dataDir, "--log-level", "warn",
		"--pool-size", fmt.Sprint(poolSize), "--max-parallel-runs", "8", "--max-queued-runs", "64",
		"--max-sessions-per-owner", fmt.Sprint(max(sessions, 50)))
	daemon.Env = os.Environ() // PORTHOLE_SANDBOX_CPUS and the like pass through
	if benchEdgeCfg.on && os.Getenv("PORTHOLE_SANDBOX_CPUS") == "" {
		// The edge is compared with a plain reverse_proxy to the same app on the host, which has no CPU
		// quota: give the sandboxed app the same CPU, so the rows differ by the path only.
		daemon.Env = append(daemon.Env, fmt.Sprintf("PORTHOLE_SANDBOX_CPUS=%d", nproc()))
	}
	daemon.Stderr = os.Stderr
	if err := daemon.Start(); err != nil {
		return err
	}
	defer func() {
		daemon.Process.Signal(os.Interrupt)
		daemon.Wait()
	}()
	if err := waitHealthy("http://" + addr + "/healthz"); err != nil {
		return err
	}

	client := &fasthttp.Client{MaxConnsPerHost: 64, ReadTimeout: 60 * time.Second, WriteTimeout: 10 * time.Second}
	if sessions > 0 {
		return benchSessions(client, addr, key, sessions)
	}
	if benchEdgeCfg.on {
		return benchEdge(filepath.Join(filepath.Dir(bin), "caddy"), dataDir, addr, key, benchEdgeCfg.dur, benchEdgeCfg.conns)
	}
	apiRun := func(p program) func() error {
		body, _ := json.Marshal(map[string]any{"language": p.lang, "source": p.source})
		return func() error {
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/api/v1/sandbox/ephemeral")
			req.Header.SetMethod("POST")
			req.Header.Set("x-api-key", key)
			req.Header.SetContentType("application/json")
			req.SetBody(body)
			if err := client.Do(req, resp); err != nil {
				return err
			}
			if resp.StatusCode() != 200 {
				return fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
			}
			var out struct {
				OK     bool            `json:"ok"`
				Result json.RawMessage `json:"result"`
			}
			if err := json.Unmarshal(resp.Body(), &out); err != nil || !out.OK || string(out.Result) != p.wantResult {
				return fmt.Errorf("bad answer: %s", resp.Body())
			}
			return nil
		}
	}
	bareRun := func(p program) func() error {
		return func() error {
			out, err := exec.Command(p.bare[0], p.bare[1:]...).Output()
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(out)) != p.wantResult {
				return fmt.Errorf("bad output %q", out)
			}
			return nil
		}
	}

	// The isolation floor: a cold sandbox per run through the runtime package, no API, no pool.
	rtDir, err := os.MkdirTemp("", "porthole-bench-rt")
	if err != nil {
		return err
	}
	defer os.RemoveAll(rtDir)
	rt, err := sbruntime.New(context.Background(), sbruntime.Config{Dir: rtDir, CgroupParent: "porthole-bench"}, zap.NewNop())
	if err != nil {
		return err
	}
	defer rt.Close()
	coldRun := func(p program) func() error {
		return func() error {
			ctx := context.Background()
			sb, err := rt.Start(ctx, sbruntime.Language(p.lang), rt.Limits())
			if err != nil {
				return err
			}
			res, err := sb.Run(ctx, sbruntime.RunRequest{Source: p.source, Timeout: 10 * time.Second})
			if err != nil {
				return err
			}
			<-sb.Done()
			if !res.OK || string(res.Result) != p.wantResult {
				return fmt.Errorf("bad result %s %+v", res.Result, res.Error)
			}
			return nil
		}
	}

	var results []*stats
	for _, p := range programs {
		// Warm up both paths (page cache, pools).
		measure("warmup", 8, 2, 0, bareRun(p))
		measure("warmup", 8, 2, 0, apiRun(p))
		time.Sleep(2 * time.Second)
		for _, c := range []int{1, 8} {
			results = append(results, measure(fmt.Sprintf("%s bare start", p.lang), n, c, 0, bareRun(p)))
			time.Sleep(2 * time.Second) // let the pools refill
			results = append(results, measure(fmt.Sprintf("%s API ephemeral", p.lang), n, c, 0, apiRun(p)))
			time.Sleep(2 * time.Second)
			results = append(results, measure(fmt.Sprintf("%s cold sandbox, no API (runc floor)", p.lang), n/2, c, 0, coldRun(p)))
		}
		results = append(results, measure(fmt.Sprintf("%s API ephemeral, paced %v", p.lang, pause), n/2, 1, pause, apiRun(p)))
		time.Sleep(2 * time.Second)
	}

	host, _ := os.Hostname()
	fmt.Printf("porthole-bench on %s, %d cores, %s; %d runs per row (paced rows: %d), pool size %d\n\n",
		host, nproc(), time.Now().UTC().Format("2006-01-02"), n, n/2, poolSize)
	fmt.Println("| measurement | concurrency | p50 ms | p99 ms | runs/s | errors |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, s := range results {
		tput := fmt.Sprintf("%.1f", s.throughput())
		if strings.Contains(s.name, "paced") {
			tput = "–" // paced on purpose: its rate is set by the pause, not by the server
		}
		fmt.Printf("| %s | %d | %.1f | %.1f | %s | %d |\n", s.name, s.concurrency,
			ms(s.pct(0.5)), ms(s.pct(0.99)), tput, s.errors)
	}
	fmt.Println()
	for i := 0; i+2 < len(results); i++ {
		a, b, c := results[i], results[i+1], results[i+2]
		if strings.HasSuffix(a.name, "bare start") && strings.HasSuffix(b.name, "API ephemeral") && a.concurrency == b.concurrency {
			fmt.Printf("- %s, concurrency %d: API throughput is %.0f%% of bare; a cold sandbox alone reaches %.0f%% of bare\n",
				strings.TrimSuffix(a.name, " bare start"), a.concurrency, 100*b.throughput()/a.throughput(), 100*c.throughput()/a.throughput())
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func nproc() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "processor") {
			n++
		}
	}
	return n
}

func waitHealthy(url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("sandboxd at %s did not become healthy", filepath.Dir(url))
}
