package api

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/edgeapi"
)

// TestRouteStreamAndSecret: the route stream sends a snapshot then changes as sessions come and go,
// and the TCP flavour of the internal endpoint refuses requests without the shared secret.
func TestRouteStreamAndSecret(t *testing.T) {
	ts := newTestServer(t, Config{}, PoolOff)
	internal := httptest.NewServer(edgeapi.New(ts.api.log, ts.sessions, ts.rt, "preview.localhost", "s3cret-s3cret-s3cret"))
	defer internal.Close()

	for _, secret := range []string{"", "wrong"} {
		req, _ := http.NewRequest("GET", internal.URL+"/internal/v1/resolve?host=x", nil)
		req.Header.Set(edgeapi.SecretHeader, secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("secret %q: %d", secret, resp.StatusCode)
		}
	}
	if _, status, _ := edgeapi.Dial(context.Background(), func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", strings.TrimPrefix(internal.URL, "http://"))
	}, "wrong", "abcdefghijklmnopqrstuvwxyz", 80); status != 401 {
		t.Fatalf("CONNECT with a wrong secret: %d", status)
	}

	existing := ts.createSession(t, ts.key, map[string]any{"language": "python", "previewAccess": "public"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", internal.URL+"/internal/v1/routes", nil)
	req.Header.Set(edgeapi.SecretHeader, "s3cret-s3cret-s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				events <- ev + " " + strings.TrimPrefix(line, "data: ")
			}
		}
		close(events)
	}()
	next := func() string {
		select {
		case e := <-events:
			return e
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return ""
	}
	if e := next(); !strings.HasPrefix(e, "snapshot ") || !strings.Contains(e, existing) || !strings.Contains(e, `"access":"public"`) {
		t.Fatalf("snapshot: %s", e)
	}
	id := ts.createSession(t, ts.key, map[string]any{"language": "python"})
	if e := next(); !strings.HasPrefix(e, "upsert ") || !strings.Contains(e, id) || !strings.Contains(e, `"status":"running"`) || !strings.Contains(e, `"access":"private"`) {
		t.Fatalf("after create: %s", e)
	}
	if code, b := ts.raw(t, "DELETE", "/api/v1/sandbox/sessions/"+id, ts.key, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	if e := next(); !strings.HasPrefix(e, "delete ") || !strings.Contains(e, id) {
		t.Fatalf("after delete: %s", e)
	}
}
