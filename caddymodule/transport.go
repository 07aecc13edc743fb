package caddymodule

import (
	"context"
	"net"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/porthole-dev/porthole/previewproxy"
)

func init() {
	caddy.RegisterModule(Transport{})
}

// Transport is Caddy's own HTTP transport (every option of `transport http` applies) with one change
// at dial time: a sandbox port's socket is asked for the connected TCP socket itself (descriptor
// passing), so sandboxd dials inside the sandbox's namespace and then steps out of the data path.
// Any other upstream is dialled as usual.
type Transport struct {
	reverseproxy.HTTPTransport
}

// CaddyModule returns the Caddy module information.
func (Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.reverse_proxy.transport.porthole", New: func() caddy.Module { return new(Transport) }}
}

// Provision sets up Caddy's HTTP transport, then wraps its dialer.
func (t *Transport) Provision(ctx caddy.Context) error {
	if err := t.HTTPTransport.Provision(ctx); err != nil {
		return err
	}
	base := t.HTTPTransport.Transport.DialContext
	t.HTTPTransport.Transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if di, ok := reverseproxy.GetDialInfo(ctx); ok && di.Network == "unix" {
			if fdSock, ok := previewproxy.FDSocket(di.Address); ok {
				return previewproxy.DialFD(ctx, fdSock)
			}
		}
		return base(ctx, network, addr)
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner  = (*Transport)(nil)
	_ caddy.CleanerUpper = (*Transport)(nil)
)
