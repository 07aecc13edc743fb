// Package api serves sandboxd's REST API: routes, authentication, the error model, limits and
// backpressure, metrics and the OpenAPI document.
package api

import (
	_ "embed"
	"fmt"
	"net/http"
	"strings"

	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/session"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

//go:embed openapi.json
var openAPIDoc []byte

// Config holds the API's limits. Zero fields take the defaults documented on each.
type Config struct {
	// MaxSourceBytes bounds `source`. Default 256 KiB.
	MaxSourceBytes int
	// DefaultTimeoutMs is a run's timeout when the request names none. Default 8000.
	DefaultTimeoutMs int
	// MaxTimeoutMs is the largest timeoutMs accepted; above it is a 400. Default 20000.
	MaxTimeoutMs int
	// MaxParallelRuns is how many runs execute at once. Default 8.
	MaxParallelRuns int
	// MaxQueuedRuns is how many more wait for a slot before new runs get 429. Default 16.
	MaxQueuedRuns int
	// MaxFileBytes bounds one file upload. Default 16 MiB (the workspace's size bounds the total).
	MaxFileBytes int
	// PreviewDomain is the domain previews are served under. Default "preview.localhost".
	PreviewDomain string
	// PreviewPort is the edge's HTTPS port, put in preview URLs unless it is 443. Default 443.
	PreviewPort int
}

func (c *Config) setDefaults() {
	if c.MaxSourceBytes == 0 {
		c.MaxSourceBytes = 256 << 10
	}
	if c.DefaultTimeoutMs == 0 {
		c.DefaultTimeoutMs = 8000
	}
	if c.MaxTimeoutMs == 0 {
		c.MaxTimeoutMs = 20000
	}
	if c.MaxParallelRuns == 0 {
		c.MaxParallelRuns = 8
	}
	if c.MaxQueuedRuns == 0 {
		c.MaxQueuedRuns = 16
	}
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = 16 << 20
	}
	if c.PreviewDomain == "" {
		c.PreviewDomain = "preview.localhost"
	}
	if c.PreviewPort == 0 {
		c.PreviewPort = 443
	}
}

// Server is the HTTP API. Its dependencies are passed in; it owns none of them.
type Server struct {
	cfg      Config
	log      *zap.Logger
	store    *store.Store
	rt       *runtime.Runtime
	pool     *runtime.Pool
	sessions *session.Manager
	limiter  *limiter
	metrics  *metrics
	handler  http.Handler
}

// New builds the API server.
func New(cfg Config, log *zap.Logger, st *store.Store, rt *runtime.Runtime, pool *runtime.Pool, sessions *session.Manager) *Server {
	cfg.setDefaults()
	s := &Server{cfg: cfg, log: log, store: st, rt: rt, pool: pool, sessions: sessions, limiter: newLimiter(cfg.MaxParallelRuns, cfg.MaxQueuedRuns)}
	s.metrics = newMetrics(s)
	s.handler = s.routes()
	return s
}

// ServeHTTP implements http.Handler. Paths with "." or ".." segments or empty segments are refused
// here with the error model: the mux would otherwise answer them with a redirect to a cleaned path,
// which for a file path is never what the client meant.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if strings.Contains(p, "//") || strings.Contains(p, "/./") || strings.Contains(p, "/../") ||
		strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") {
		s.observe("invalid path", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeError(w, r, http.StatusBadRequest, CodeInvalidArgument, "the path has empty, . or .. segments; name files relative to /workspace without them")
		})).ServeHTTP(w, r)
		return
	}
	s.handler.ServeHTTP(w, r)
}

// Route is one entry of the API surface. The OpenAPI document must list exactly these.
type Route struct {
	Method, Path string
	Auth         bool
	handler      http.HandlerFunc
}

// Routes returns the API surface.
func (s *Server) Routes() []Route {
	return []Route{
		{http.MethodPost, "/api/v1/sandbox/ephemeral", true, s.handleEphemeral},
		{http.MethodPost, "/api/v1/sandbox/sessions", true, s.handleCreateSession},
		{http.MethodGet, "/api/v1/sandbox/sessions", true, s.handleListSessions},
		{http.MethodGet, "/api/v1/sandbox/sessions/{id}", true, s.handleGetSession},
		{http.MethodDelete, "/api/v1/sandbox/sessions/{id}", true, s.handleDeleteSession},
		{http.MethodPost, "/api/v1/sandbox/sessions/{id}/execute", true, s.handleExecute},
		{http.MethodGet, "/api/v1/sandbox/sessions/{id}/files/{path...}", true, s.handleGetFile},
		{http.MethodPut, "/api/v1/sandbox/sessions/{id}/files/{path...}", true, s.handlePutFile},
		{http.MethodDelete, "/api/v1/sandbox/sessions/{id}/files/{path...}", true, s.handleDeleteFile},
		{http.MethodPost, "/api/v1/sandbox/sessions/{id}/processes", true, s.handleStartProcess},
		{http.MethodGet, "/api/v1/sandbox/sessions/{id}/processes", true, s.handleListProcesses},
		{http.MethodGet, "/api/v1/sandbox/sessions/{id}/processes/{pid}", true, s.handleGetProcess},
		{http.MethodDelete, "/api/v1/sandbox/sessions/{id}/processes/{pid}", true, s.handleStopProcess},
		{http.MethodGet, "/api/v1/sandbox/sessions/{id}/processes/{pid}/logs", true, s.handleLogs},
		{http.MethodGet, "/api/v1/sandbox/sessions/{id}/previews", true, s.handlePreviews},
		{http.MethodGet, "/api/v1/sandbox/threads/{threadId}", true, s.handleGetThread},
		{http.MethodPost, "/api/v1/sandbox/threads/{threadId}/start", true, s.handleStartThread},
		{http.MethodGet, "/api/v1/openapi.json", true, s.handleOpenAPI},
		{http.MethodGet, "/healthz", false, s.handleHealthz},
		{http.MethodGet, "/metrics", false, promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}).ServeHTTP},
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	byPath := map[string]map[string]http.Handler{}
	var order []string
	for _, rt := range s.Routes() {
		var h http.Handler = rt.handler
		if rt.Auth {
			h = s.authenticate(h)
		}
		if byPath[rt.Path] == nil {
			byPath[rt.Path] = map[string]http.Handler{}
			order = append(order, rt.Path)
		}
		byPath[rt.Path][rt.Method] = s.observe(rt.Method+" "+rt.Path, h)
	}
	for _, p := range order {
		mux.Handle(p, methods(byPath[p]))
	}
	mux.Handle("/", s.observe("unknown", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no route %s %s; see /api/v1/openapi.json", r.Method, r.URL.Path))
	})))
	return mux
}

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "sandboxesAlive": s.rt.Alive()})
}

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPIDoc)
}
