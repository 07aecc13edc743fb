// Package api serves sandboxd's REST API: routes, authentication, the error model, limits and
// backpressure, metrics and the OpenAPI document.
package api

import (
	_ "embed"
	"fmt"
	"net/http"

	"github.com/porthole-dev/porthole/sandboxd/runtime"
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
}

// Server is the HTTP API. Its dependencies are passed in; it owns none of them.
type Server struct {
	cfg     Config
	log     *zap.Logger
	store   *store.Store
	rt      *runtime.Runtime
	pool    *runtime.Pool
	limiter *limiter
	metrics *metrics
	handler http.Handler
}

// New builds the API server.
func New(cfg Config, log *zap.Logger, st *store.Store, rt *runtime.Runtime, pool *runtime.Pool) *Server {
	cfg.setDefaults()
	s := &Server{cfg: cfg, log: log, store: st, rt: rt, pool: pool, limiter: newLimiter(cfg.MaxParallelRuns, cfg.MaxQueuedRuns)}
	s.metrics = newMetrics(s)
	s.handler = s.routes()
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

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
