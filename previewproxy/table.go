package previewproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"
)

// Route is what the edge knows of a sandbox.
type Route struct {
	SandboxID string `json:"sandboxId"`
	Access    string `json:"access"` // "private" or "public"
	Status    string `json:"status"` // "running", "stopped", "lost"
}

// Live reports whether the sandbox can be served (now, or after waking).
func (r Route) Live() bool { return r.Status == "running" || r.Status == "stopped" }

// Sandboxd is the client of sandboxd's internal endpoint: a unix socket in its data dir.
type Sandboxd struct {
	// Socket is the path of sandboxd's internal.sock.
	Socket string
	// FwdDir is where sandboxd keeps one socket per listening sandbox port.
	FwdDir string
	http   *http.Client
}

// NewSandboxd makes a client for the sandboxd whose data dir is dataDir.
func NewSandboxd(dataDir string) *Sandboxd {
	sock := strings.TrimSuffix(dataDir, "/") + "/internal.sock"
	return &Sandboxd{
		Socket: sock,
		FwdDir: strings.TrimSuffix(dataDir, "/") + "/fwd",
		http: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			},
			MaxIdleConns: 16, IdleConnTimeout: time.Minute,
		}},
	}
}

// UpstreamDial is the Caddy network address of a sandbox port: sandboxd's socket for it.
func (c *Sandboxd) UpstreamDial(t Target) string {
	return fmt.Sprintf("unix/%s/%s-%d.sock", c.FwdDir, t.SandboxID, t.Port)
}

// Resolve asks sandboxd about one sandbox (a table miss).
func (c *Sandboxd) Resolve(ctx context.Context, host string) (Route, bool, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://sandboxd/internal/v1/resolve?host="+host, nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return Route{}, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return Route{}, false, nil
	}
	if resp.StatusCode != http.StatusOK {
		return Route{}, false, fmt.Errorf("resolve: status %d", resp.StatusCode)
	}
	var r Route
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&r); err != nil {
		return Route{}, false, err
	}
	return r, true, nil
}

// Wake asks sandboxd to start a stopped sandbox.
func (c *Sandboxd) Wake(ctx context.Context, id string) error {
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://sandboxd/internal/v1/wake?sandbox="+id, nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Table is the edge's in-memory route table: a map read per request, fed by sandboxd's route stream.
// No Caddy config reload happens when sandboxes come and go. A miss asks sandboxd once; unknown
// sandboxes are remembered briefly (a negative cache), so a flood of random hosts costs sandboxd at
// most one question per id per NegativeTTL.
type Table struct {
	Domain      string
	NegativeTTL time.Duration // default 5s
	MaxNegative int           // entries, default 100000
	// ResolveLimit bounds the questions a flood of distinct unknown hosts can send sandboxd, per
	// second (burst the same); beyond it a miss is answered "unknown" without asking. Default 100.
	resolveLimit *rate.Limiter
	// OnResolve, if set, is called for every question sent to sandboxd (for metrics).
	OnResolve func()

	client *Sandboxd
	log    *zap.Logger

	mu       sync.RWMutex
	routes   map[string]Route
	negative map[string]time.Time
}

// NewTable makes a table for domain fed by client.
func NewTable(domain string, client *Sandboxd, log *zap.Logger) *Table {
	return &Table{Domain: domain, NegativeTTL: 5 * time.Second, MaxNegative: 100000, client: client, log: log,
		resolveLimit: rate.NewLimiter(100, 100),
		routes:       map[string]Route{}, negative: map[string]time.Time{}}
}

// Client returns the sandboxd client.
func (t *Table) Client() *Sandboxd { return t.client }

// Lookup returns the route of a parsed target. ok is false for an unknown sandbox.
func (t *Table) Lookup(ctx context.Context, tg Target) (Route, bool) {
	t.mu.RLock()
	r, ok := t.routes[tg.SandboxID]
	neg, isNeg := t.negative[tg.SandboxID]
	t.mu.RUnlock()
	if ok {
		return r, true
	}
	if isNeg && time.Since(neg) < t.NegativeTTL {
		return Route{}, false
	}
	// A miss: the stream may not have told us yet (or is reconnecting). Ask once, within the budget.
	if !t.resolveLimit.Allow() {
		return Route{}, false
	}
	if t.OnResolve != nil {
		t.OnResolve()
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, found, err := t.client.Resolve(rctx, tg.Host(t.Domain))
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil || !found {
		if len(t.negative) >= t.MaxNegative {
			t.negative = map[string]time.Time{} // bounded: start over rather than grow
		}
		t.negative[tg.SandboxID] = time.Now()
		return Route{}, false
	}
	t.routes[r.SandboxID] = r
	return r, true
}

// Live reports whether a host names a sandbox that exists (for the TLS permission).
func (t *Table) Live(ctx context.Context, host string) bool {
	tg, err := ParseHost(host, t.Domain)
	if err != nil {
		return false
	}
	r, ok := t.Lookup(ctx, tg)
	return ok && r.Live()
}

func (t *Table) apply(ev string, data []byte) error {
	switch ev {
	case "snapshot":
		var all []Route
		if err := json.Unmarshal(data, &all); err != nil {
			return err
		}
		m := make(map[string]Route, len(all))
		for _, r := range all {
			m[r.SandboxID] = r
		}
		t.mu.Lock()
		t.routes, t.negative = m, map[string]time.Time{}
		t.mu.Unlock()
	case "upsert", "delete":
		var r Route
		if err := json.Unmarshal(data, &r); err != nil {
			return err
		}
		t.mu.Lock()
		if ev == "delete" {
			delete(t.routes, r.SandboxID)
		} else {
			t.routes[r.SandboxID] = r
			delete(t.negative, r.SandboxID)
		}
		t.mu.Unlock()
	}
	return nil
}

// Follow consumes sandboxd's route stream until ctx ends, reconnecting with backoff. Each connection
// starts with a snapshot that replaces the table.
func (t *Table) Follow(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := t.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("route stream ended; reconnecting", zap.Error(err), zap.Duration("backoff", backoff))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (t *Table) follow(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://sandboxd/internal/v1/routes", nil)
	resp, err := t.client.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("route stream: status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // a snapshot of many sandboxes is one line
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := t.apply(event, []byte(strings.TrimPrefix(line, "data: "))); err != nil {
				return fmt.Errorf("route stream: %w", err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("route stream closed")
}
