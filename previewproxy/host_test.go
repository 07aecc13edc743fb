package previewproxy

import (
	"strings"
	"testing"
)

const id = "abcdefghijklmnopqrstuvwxyz"

func TestParseHost(t *testing.T) {
	good := []struct {
		host string
		port int
	}{
		{"3000-" + id + ".preview.localhost", 3000},
		{"3000-" + id + ".preview.localhost:8443", 3000},
		{"1-" + id + ".PREVIEW.localhost", 1},
		{"65535-" + strings.ToUpper(id) + ".preview.localhost", 65535},
	}
	for _, g := range good {
		tg, err := ParseHost(g.host, "preview.localhost")
		if err != nil || tg.Port != g.port || tg.SandboxID != id {
			t.Errorf("ParseHost(%q) = %+v, %v", g.host, tg, err)
		}
	}
	bad := []string{
		"", "preview.localhost", id + ".preview.localhost", "0-" + id + ".preview.localhost",
		"03000-" + id + ".preview.localhost", "65536-" + id + ".preview.localhost", "99999-" + id + ".preview.localhost",
		"-3000-" + id + ".preview.localhost", "3000-" + id + "-x.preview.localhost", "3000-" + id + ".evil.preview.localhost",
		"a.3000-" + id + ".preview.localhost", "3000-" + id + ".preview.localhost.", "3000-" + id + ".preview.localhost.evil.com",
		"3000-short.preview.localhost", "3000-" + id + "é.preview.localhost", "127.0.0.1", "[::1]:443",
		"3000-" + id + ".preview.localhost:99999", "3000-" + id + ".preview.localhost:x", "+3000-" + id + ".preview.localhost",
		"3000-" + id + "_.preview.localhost", "3000-" + strings.Repeat("a", 64) + ".preview.localhost",
		"3000-" + id + ".xpreview.localhost",
	}
	for _, h := range bad {
		if tg, err := ParseHost(h, "preview.localhost"); err == nil {
			t.Errorf("ParseHost(%q) = %+v, want an error", h, tg)
		}
	}
}

func FuzzParseHost(f *testing.F) {
	f.Add("3000-" + id + ".preview.localhost")
	f.Add("03000-" + id + ".preview.localhost:1")
	f.Fuzz(func(t *testing.T, host string) {
		tg, err := ParseHost(host, "preview.localhost")
		if err != nil {
			return
		}
		// Whatever parses must print back to the same host, lowercased and without the port.
		h := host
		if i := strings.LastIndexByte(h, ':'); i >= 0 {
			h = h[:i]
		}
		if got := tg.Host("preview.localhost"); got != strings.ToLower(h) {
			t.Fatalf("ParseHost(%q) = %+v, which prints as %q", host, tg, got)
		}
		if tg.Port < 1 || tg.Port > 65535 {
			t.Fatalf("port %d out of range", tg.Port)
		}
	})
}
