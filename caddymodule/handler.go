package caddymodule

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/porthole-dev/porthole/previewproxy"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(PreviewHandler{})
}

// targetVar is the request variable through which the handler tells the upstream source the target.
const targetVar = "porthole.target"

// PreviewHandler goes before reverse_proxy on the preview site. It answers hosts that are not
// previews of live sandboxes with a 404 page, wakes stopped sandboxes behind a wait page, refuses
// private previews (until preview tokens exist), strips client forwarding headers, and turns
// "nothing listens on that port yet" into a self-refreshing wait page.
type PreviewHandler struct {
	Config
	// UpstreamHost is the Host the sandbox's server sees: "preserve" (default) keeps the preview
	// host; "localhost" sends localhost:<port>, which dev servers with host checks (Vite's
	// allowedHosts) accept.
	UpstreamHost string `json:"upstream_host,omitempty"`

	table *previewproxy.Table
	log   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (PreviewHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.porthole_preview", New: func() caddy.Module { return new(PreviewHandler) }}
}

// Provision sets up the handler.
func (h *PreviewHandler) Provision(ctx caddy.Context) error {
	h.log = ctx.Logger()
	if err := h.Config.defaults(); err != nil {
		return err
	}
	t, err := h.Config.acquire(h.log)
	if err != nil {
		return err
	}
	h.table = t
	return registerMetrics(ctx.GetMetricsRegistry())
}

// Validate checks the configuration.
func (h *PreviewHandler) Validate() error {
	switch h.UpstreamHost {
	case "", "preserve", "localhost":
		return nil
	}
	return errors.New(`porthole_preview: upstream_host must be "preserve" or "localhost"`)
}

// Cleanup releases the shared table.
func (h *PreviewHandler) Cleanup() error {
	h.Config.release()
	return nil
}

func (h *PreviewHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Route on Host only. (Caddy has already matched the TLS server name to this site; a Host naming
	// another sandbox than the SNI is refused by the strict SNI/Host check of the server.)
	tg, err := previewproxy.ParseHost(r.Host, h.Domain)
	if err != nil {
		edgeRequests.WithLabelValues("not_found").Inc()
		previewproxy.NotFound(w)
		return nil
	}
	route, ok := h.table.Lookup(r.Context(), tg)
	if !ok || !route.Live() {
		edgeRequests.WithLabelValues("not_found").Inc()
		previewproxy.NotFound(w)
		return nil
	}
	if route.Status == "stopped" {
		_ = h.table.Client().Wake(r.Context(), route.SandboxID)
		edgeRequests.WithLabelValues("waking").Inc()
		previewproxy.Waking(w)
		return nil
	}
	if route.Access != "public" {
		edgeRequests.WithLabelValues("private").Inc()
		previewproxy.Private(w)
		return nil
	}
	previewproxy.StripClientForwarding(r.Header)
	caddyhttp.SetVar(r.Context(), targetVar, tg)
	if h.UpstreamHost == "localhost" {
		r.Host = "localhost:" + strconv.Itoa(tg.Port)
	}
	err = next.ServeHTTP(w, r)
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode == http.StatusBadGateway {
		// reverse_proxy could not reach the port (its socket does not exist until something listens).
		edgeRequests.WithLabelValues("waiting_for_port").Inc()
		previewproxy.WaitingForPort(w, tg.Port)
		return nil
	}
	edgeRequests.WithLabelValues("proxied").Inc()
	return err
}

// Interface guards
var (
	_ caddy.Provisioner           = (*PreviewHandler)(nil)
	_ caddy.Validator             = (*PreviewHandler)(nil)
	_ caddy.CleanerUpper          = (*PreviewHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*PreviewHandler)(nil)
)
