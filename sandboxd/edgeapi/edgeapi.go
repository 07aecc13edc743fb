// Package edgeapi is sandboxd's internal endpoint for the edge. It is not on the public API
// listener: it serves on a unix socket in the data dir (and, for an edge on another host, on TCP with
// a shared secret). Three calls:
//
//	GET     /internal/v1/resolve?host=H   what a preview host names: sandbox, port, access, status
//	GET     /internal/v1/routes           server-sent events: a snapshot, then every route change
//	CONNECT <sandboxId>:<port>            a byte stream to 127.0.0.1:<port> inside the sandbox's
//	                                      network namespace (no HTTP parsing past the handshake)
package edgeapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/porthole-dev/porthole/previewproxy"
	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/session"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
)

// SecretHeader carries the shared secret on the TCP listener.
const SecretHeader = "X-Porthole-Internal-Secret"

// Server is the internal endpoint.
type Server struct {
	log           *zap.Logger
	sessions      *session.Manager
	rt            *runtime.Runtime
	previewDomain string
	secret        string // required when non-empty (TCP listener)
}

// New builds the internal endpoint. secret, when non-empty, must accompany every request.
func New(log *zap.Logger, sessions *session.Manager, rt *runtime.Runtime, previewDomain, secret string) *Server {
	return &Server{log: log, sessions: sessions, rt: rt, previewDomain: previewDomain, secret: secret}
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.secret != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(SecretHeader)), []byte(s.secret)) != 1 {
		writeErr(w, http.StatusUnauthorized, "unauthenticated", "missing or wrong "+SecretHeader)
		return
	}
	switch {
	case r.Method == http.MethodConnect:
		s.forward(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/internal/v1/resolve":
		s.resolve(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/internal/v1/routes":
		s.routes(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/internal/v1/wake":
		s.wake(w, r)
	default:
		writeErr(w, http.StatusNotFound, "not_found", "no such internal route")
	}
}

// Route is the answer to resolve.
type Route struct {
	SandboxID string `json:"sandboxId"`
	Port      int    `json:"port"`
	Access    string `json:"access"`
	Status    string `json:"status"`
}

func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	t, err := previewproxy.ParseHost(r.URL.Query().Get("host"), s.previewDomain)
	if err != nil {
		writeErr(w, http.StatusNotFound, "not_found", "not a preview host")
		return
	}
	ses, err := s.sessions.Resolve(r.Context(), t.SandboxID)
	if err != nil {
		writeErr(w, http.StatusNotFound, "not_found", "no such sandbox")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Route{SandboxID: ses.ID, Port: t.Port, Access: ses.PreviewAccess, Status: ses.Status})
}

// wake starts a stopped sandbox in the background (the edge shows its wait page meanwhile).
func (s *Server) wake(w http.ResponseWriter, r *http.Request) {
	ses, err := s.sessions.Resolve(r.Context(), r.URL.Query().Get("sandbox"))
	if err != nil {
		writeErr(w, http.StatusNotFound, "not_found", "no such sandbox")
		return
	}
	if ses.Status == store.StatusStopped {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.sessions.Ready(ctx, ses.Owner, ses.ID); err != nil {
				s.log.Warn("wake session", zap.String("session", ses.ID), zap.Error(err))
			}
		}()
	}
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) routes(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeErr(w, http.StatusInternalServerError, "internal", "streaming unsupported")
		return
	}
	snap, ch, cancel, err := s.sessions.Subscribe(r.Context())
	if err != nil {
		writeErr(w, http.StatusServiceUnavailable, "unavailable", "cannot list sessions")
		return
	}
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	send := func(event string, v any) error {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}
	if err := send("snapshot", snap); err != nil {
		return
	}
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return // fell behind: the client reconnects and gets a fresh snapshot
			}
			if send(ev.Type, ev) != nil {
				return
			}
		case <-ping.C:
			if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// forward answers CONNECT <sandboxId>:<port>: 200 and a byte stream, or an error status the edge
// turns into a page: 404 unknown sandbox, 503 + Retry-After while a stopped sandbox wakes, 502 with
// X-Porthole-Dial: refused when nothing listens on the port yet.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	id, portStr, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		writeErr(w, http.StatusBadRequest, "invalid_argument", "CONNECT <sandboxId>:<port>")
		return
	}
	ses, err := s.sessions.Resolve(r.Context(), id)
	if err != nil {
		writeErr(w, http.StatusNotFound, "not_found", "no such sandbox")
		return
	}
	switch ses.Status {
	case store.StatusRunning:
	case store.StatusStopped:
		// Wake it in the background; the edge shows its wait page and retries.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.sessions.Ready(ctx, ses.Owner, ses.ID); err != nil {
				s.log.Warn("wake session", zap.String("session", ses.ID), zap.Error(err))
			}
		}()
		w.Header().Set("Retry-After", "2")
		writeErr(w, http.StatusServiceUnavailable, "unavailable", "the sandbox is waking up")
		return
	default:
		writeErr(w, http.StatusNotFound, "not_found", "the sandbox is "+ses.Status)
		return
	}
	upstream, err := s.rt.DialPort(r.Context(), id, port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			w.Header().Set("X-Porthole-Dial", "refused")
			writeErr(w, http.StatusBadGateway, "unavailable", fmt.Sprintf("nothing listens on port %d yet", port))
			return
		}
		if errors.Is(err, runtime.ErrNotRunning) {
			w.Header().Set("Retry-After", "2")
			writeErr(w, http.StatusServiceUnavailable, "unavailable", "the sandbox is not running")
			return
		}
		s.log.Warn("dial into sandbox", zap.String("sandbox", id), zap.Int("port", port), zap.Error(err))
		writeErr(w, http.StatusBadGateway, "unavailable", "cannot reach the port")
		return
	}
	defer upstream.Close()
	s.sessions.Touch(ses.ID)
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeErr(w, http.StatusInternalServerError, "internal", "cannot hijack")
		return
	}
	w.WriteHeader(http.StatusOK)
	client, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer client.Close()
	// Bytes the client sent right after the handshake may sit in the server's buffer.
	var pending []byte
	if n := buf.Reader.Buffered(); n > 0 {
		pending, _ = buf.Reader.Peek(n)
	}
	pipe(client, upstream, pending)
}

// pipe copies bytes both ways between client and upstream (pending first, towards upstream) until
// both directions end, half-closing each side as its input ends.
func pipe(client, upstream net.Conn, pending []byte) {
	done := make(chan struct{}, 2)
	go func() {
		if _, err := upstream.Write(pending); err == nil {
			_, _ = io.Copy(upstream, client)
		}
		closeWrite(upstream)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(client, upstream)
		closeWrite(client)
		done <- struct{}{}
	}()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// Dial opens a CONNECT stream to sandbox port through an internal endpoint reached by dial (a unix
// socket, or TCP with secret). It returns the stream, or the endpoint's status and message.
func Dial(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), secret, sandboxID string, port int) (net.Conn, int, error) {
	c, err := dial(ctx)
	if err != nil {
		return nil, 0, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	hdr := ""
	if secret != "" {
		hdr = SecretHeader + ": " + secret + "\r\n"
	}
	target := net.JoinHostPort(sandboxID, strconv.Itoa(port))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, hdr); err != nil {
		c.Close()
		return nil, 0, err
	}
	// Read the response head byte by byte so no byte of the stream is consumed past it.
	var head []byte
	one := make([]byte, 1)
	for !strings.HasSuffix(string(head), "\r\n\r\n") {
		if _, err := c.Read(one); err != nil {
			c.Close()
			return nil, 0, fmt.Errorf("edgeapi: read CONNECT answer: %w", err)
		}
		head = append(head, one[0])
		if len(head) > 16<<10 {
			c.Close()
			return nil, 0, errors.New("edgeapi: CONNECT answer too long")
		}
	}
	var status int
	if _, err := fmt.Sscanf(string(head), "HTTP/1.1 %d", &status); err != nil {
		c.Close()
		return nil, 0, fmt.Errorf("edgeapi: bad CONNECT answer %q", head)
	}
	if status != http.StatusOK {
		c.Close()
		return nil, status, fmt.Errorf("edgeapi: CONNECT %s: %s", target, strings.SplitN(string(head), "\r\n", 2)[0])
	}
	_ = c.SetDeadline(time.Time{})
	return c, status, nil
}
