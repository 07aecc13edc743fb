package api

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
)

type ctxKey int

const (
	ctxRequestID ctxKey = iota
	ctxLogger
	ctxOwner
)

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(ctxRequestID).(string)
	return id
}

// loggerFrom returns the request's logger: every line it writes carries the request id.
func (s *Server) loggerFrom(ctx context.Context) *zap.Logger {
	if l, ok := ctx.Value(ctxLogger).(*zap.Logger); ok {
		return l
	}
	return s.log
}

func ownerFrom(ctx context.Context) string {
	o, _ := ctx.Value(ctxOwner).(string)
	return o
}

// validRequestID accepts a client's X-Request-Id only if it is short and plain.
func validRequestID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Hijack lets WebSocket upgrades through (log follow); the connection then counts as 101.
func (r *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := r.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("hijacking not supported")
	}
	if r.status == 0 {
		r.status = http.StatusSwitchingProtocols
	}
	return h.Hijack()
}

// Flush lets streamed answers through.
func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// observe gives every request an id and a logger, logs it once done, and turns a panic into a 500.
func (s *Server) observe(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-Id")
		if !validRequestID(id) {
			id = newRequestID()
		}
		log := s.log.With(zap.String("requestId", id))
		ctx := context.WithValue(context.WithValue(r.Context(), ctxRequestID, id), ctxLogger, log)
		r = r.WithContext(ctx)
		w.Header().Set("X-Request-Id", id)
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.Error("panic in handler", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
				if rec.status == 0 {
					writeError(rec, r, http.StatusInternalServerError, CodeInternal, "internal error; report the request id")
				}
			}
			log.Info("request",
				zap.String("method", r.Method), zap.String("route", route), zap.String("path", r.URL.Path),
				zap.Int("status", rec.status), zap.Duration("duration", time.Since(start)),
				zap.String("owner", ownerFrom(r.Context())))
		}()
		next.ServeHTTP(rec, r)
	})
}

// authenticate requires a valid x-api-key and puts its owner in the context.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("x-api-key")
		if key == "" {
			writeError(w, r, http.StatusUnauthorized, CodeUnauthenticated, "missing x-api-key header; create a key with `sandboxd keys create --owner NAME`")
			return
		}
		owner, err := s.store.Authenticate(r.Context(), key)
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, r, http.StatusUnauthorized, CodeUnauthenticated, "invalid or revoked API key")
			return
		}
		if err != nil {
			s.loggerFrom(r.Context()).Error("authenticate", zap.Error(err))
			writeError(w, r, http.StatusServiceUnavailable, CodeUnavailable, "cannot check the API key right now; retry")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxOwner, owner)))
	})
}

// methods dispatches one path by method and answers others with 405 and the error model.
func methods(handlers map[string]http.Handler) http.Handler {
	allow := ""
	for m := range handlers {
		if allow != "" {
			allow += ", "
		}
		allow += m
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := handlers[r.Method]
		if !ok && r.Method == http.MethodHead {
			h, ok = handlers[http.MethodGet]
		}
		if !ok {
			w.Header().Set("Allow", allow)
			writeError(w, r, http.StatusMethodNotAllowed, CodeMethodNotAllowed, fmt.Sprintf("%s is not allowed here; use %s", r.Method, allow))
			return
		}
		h.ServeHTTP(w, r)
	})
}
