package caddymodule

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/porthole-dev/porthole/previewproxy"
)

func init() {
	caddy.RegisterModule(Upstreams{})
}

// Upstreams is a dynamic upstream source for reverse_proxy: the upstream of a preview request is
// sandboxd's unix socket for that sandbox port. It reads the target the preview handler decided, so
// the upstream always matches the policy that was applied.
type Upstreams struct {
	Config
	client *previewproxy.Sandboxd
}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.reverse_proxy.upstreams.porthole", New: func() caddy.Module { return new(Upstreams) }}
}

// Provision sets up the upstream source.
func (u *Upstreams) Provision(ctx caddy.Context) error {
	if err := u.Config.defaults(); err != nil {
		return err
	}
	u.client = previewproxy.NewSandboxd(u.DataDir)
	return nil
}

// GetUpstreams returns the one upstream of r.
func (u *Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	tg, ok := caddyhttp.GetVar(r.Context(), targetVar).(previewproxy.Target)
	if !ok {
		return nil, fmt.Errorf("porthole: no preview target for this request (is porthole_preview before reverse_proxy?)")
	}
	return []*reverseproxy.Upstream{{Dial: u.client.UpstreamDial(tg)}}, nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
)
