package caddymodule

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

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
	cache  *sync.Map // Target → []*reverseproxy.Upstream, reused like Caddy's SRV source does
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
	u.cache = &sync.Map{}
	return nil
}

// GetUpstreams returns the one upstream of r.
func (u *Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	tg, ok := caddyhttp.GetVar(r.Context(), targetVar).(previewproxy.Target)
	if !ok {
		return nil, fmt.Errorf("porthole: no preview target for this request (is porthole_preview before reverse_proxy?)")
	}
	if ups, ok := u.cache.Load(tg); ok {
		return ups.([]*reverseproxy.Upstream), nil
	}
	ups := []*reverseproxy.Upstream{{Dial: u.client.UpstreamDial(tg)}}
	if n := cacheSize.Add(1); n > maxCachedUpstreams {
		u.cache.Clear() // bounded: start over rather than grow with every port ever seen
		cacheSize.Store(0)
	}
	u.cache.Store(tg, ups)
	return ups, nil
}

// maxCachedUpstreams bounds the upstream cache (one entry per sandbox port seen).
const maxCachedUpstreams = 100000

var cacheSize atomic.Int64

// Interface guards
var (
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
)
