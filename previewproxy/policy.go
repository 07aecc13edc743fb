package previewproxy

import (
	"fmt"
	"html"
	"net/http"
	"strings"
)

// StripClientForwarding removes the forwarding headers a client sent: only the edge says who the
// client is, and routing never looks at them (a preview is chosen by Host alone).
func StripClientForwarding(h http.Header) {
	for k := range h {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "X-Forwarded-") {
			delete(h, k)
		}
	}
	h.Del("Forwarded")
	h.Del("X-Real-Ip")
}

// Page writes one of the edge's own pages. refresh > 0 makes it reload itself (and sets Retry-After),
// for pages that wait for something.
func Page(w http.ResponseWriter, status int, title, message string, refresh int) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	meta := ""
	if refresh > 0 {
		h.Set("Retry-After", fmt.Sprint(refresh))
		meta = fmt.Sprintf(`<meta http-equiv="refresh" content="%d">`, refresh)
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `<!doctype html><html><head><meta charset="utf-8">%s<title>%s</title>
<style>body{font:16px system-ui,sans-serif;margin:15vh auto;max-width:34em;color:#333;text-align:center}</style></head>
<body><h1>%s</h1><p>%s</p></body></html>
`, meta, html.EscapeString(title), html.EscapeString(title), html.EscapeString(message))
}

// The pages of the preview edge.
func NotFound(w http.ResponseWriter) {
	Page(w, http.StatusNotFound, "No such preview", "There is no sandbox at this address, or it has ended.", 0)
}

func Private(w http.ResponseWriter) {
	Page(w, http.StatusForbidden, "Private preview", "This preview is private. Open it from the app that created it (it signs a short-lived link).", 0)
}

func Waking(w http.ResponseWriter) {
	Page(w, http.StatusServiceUnavailable, "Waking up the sandbox", "The sandbox was asleep and is starting. This page reloads by itself.", 2)
}

func WaitingForPort(w http.ResponseWriter, port int) {
	Page(w, http.StatusServiceUnavailable, fmt.Sprintf("Waiting for port %d", port),
		fmt.Sprintf("Nothing listens on port %d inside the sandbox yet. This page reloads by itself.", port), 2)
}
