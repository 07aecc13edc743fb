package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// benchSessions measures durable sessions: create→ready, execute latency, memory per idle session,
// and how many idle sessions the machine holds (up to max), reporting what ran out first.
func benchSessions(client *fasthttp.Client, addr, key string, max int) error {
	call := func(method, path, body string) (int, map[string]any, error) {
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + path)
		req.Header.SetMethod(method)
		req.Header.Set("x-api-key", key)
		if body != "" {
			req.SetBodyString(body)
		}
		if err := client.DoTimeout(req, resp, 2*time.Minute); err != nil {
			return 0, nil, err
		}
		var out map[string]any
		_ = json.Unmarshal(resp.Body(), &out)
		return resp.StatusCode(), out, nil
	}
	create := func(lang string) (string, error) {
		code, out, err := call("POST", "/api/v1/sandbox/sessions", fmt.Sprintf(`{"language":%q}`, lang))
		if err != nil {
			return "", err
		}
		if code != 201 {
			return "", fmt.Errorf("status %d: %v", code, out["error"])
		}
		return out["id"].(string), nil
	}
	var rows []*stats
	var ids []string
	for _, lang := range []string{"python", "javascript"} {
		s := measure(lang+" session create→ready", 20, 1, 0, func() error {
			id, err := create(lang)
			if err == nil {
				ids = append(ids, id)
			}
			return err
		})
		rows = append(rows, s)
		id := ids[len(ids)-1]
		src := `{"source":"state['n'] = state.get('n', 0) + 1\nreturn state['n']"}`
		if lang == "javascript" {
			src = `{"source":"state.n = (state.n || 0) + 1; return state.n;"}`
		}
		exec := func() error {
			code, out, err := call("POST", "/api/v1/sandbox/sessions/"+id+"/execute", src)
			if err != nil {
				return err
			}
			if code != 200 || out["ok"] != true {
				return fmt.Errorf("status %d: %v", code, out)
			}
			return nil
		}
		rows = append(rows, measure(lang+" session execute, back to back", 100, 1, 0, exec))
		rows = append(rows, measure(lang+" session execute, paced 250ms", 40, 1, 250*time.Millisecond, exec))
	}
	for _, id := range ids {
		call("DELETE", "/api/v1/sandbox/sessions/"+id, "")
	}
	fmt.Println("| measurement | runs | p50 ms | p99 ms |")
	fmt.Println("|---|---:|---:|---:|")
	for _, s := range rows {
		fmt.Printf("| %s | %d | %.1f | %.1f |\n", s.name, len(s.lat), ms(s.pct(0.5)), ms(s.pct(0.99)))
	}
	fmt.Println()

	// Capacity: idle python sessions until max, or until creating one fails.
	time.Sleep(3 * time.Second)
	before := memAvailable()
	start := time.Now()
	var made []string
	var stopReason string
	for len(made) < max {
		id, err := create("python")
		if err != nil {
			stopReason = err.Error()
			break
		}
		made = append(made, id)
		if len(made)%50 == 0 {
			fmt.Fprintf(os.Stderr, "  %d idle sessions, %.1f GiB available, %s\n", len(made), float64(memAvailable())/(1<<30), time.Since(start).Round(time.Second))
		}
	}
	time.Sleep(5 * time.Second) // let warm runners settle
	after := memAvailable()
	n := len(made)
	if stopReason == "" {
		stopReason = fmt.Sprintf("nothing: stopped at the %d asked for", max)
	}
	fmt.Printf("Idle python sessions created: %d in %s; what stopped it: %s\n", n, time.Since(start).Round(time.Second), stopReason)
	if n > 0 {
		fmt.Printf("Memory per idle session (MemAvailable drop / sessions): %.1f MiB; available after: %.1f GiB\n",
			float64(before-after)/float64(n)/(1<<20), float64(after)/(1<<30))
	}
	// Executes still work at that density.
	if n > 0 {
		s := measure("execute with all sessions idle", 20, 1, 0, func() error {
			code, out, err := call("POST", "/api/v1/sandbox/sessions/"+made[n/2]+"/execute", `{"source":"return 1"}`)
			if err != nil || code != 200 || out["ok"] != true {
				return fmt.Errorf("%d %v %v", code, out, err)
			}
			return nil
		})
		fmt.Printf("Execute p50 with %d idle sessions: %.1f ms (p99 %.1f ms)\n", n, ms(s.pct(0.5)), ms(s.pct(0.99)))
	}
	for _, id := range made {
		call("DELETE", "/api/v1/sandbox/sessions/"+id, "")
	}
	return nil
}

func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
