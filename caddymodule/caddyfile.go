package caddymodule

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("porthole_preview", parsePreviewHandler)
	httpcaddyfile.RegisterDirectiveOrder("porthole_preview", httpcaddyfile.Before, "reverse_proxy")
}

// unmarshalConfig reads the subdirectives shared by every Porthole module:
//
//	{
//	    data_dir <sandboxd data dir>
//	    domain   <preview domain>
//	}
func (c *Config) unmarshalSub(d *caddyfile.Dispenser) (bool, error) {
	switch d.Val() {
	case "data_dir":
		if !d.NextArg() {
			return true, d.ArgErr()
		}
		c.DataDir = d.Val()
	case "domain":
		if !d.NextArg() {
			return true, d.ArgErr()
		}
		c.Domain = d.Val()
	default:
		return false, nil
	}
	return true, nil
}

// parsePreviewHandler parses:
//
//	porthole_preview {
//	    data_dir      <dir>
//	    domain        <preview domain>
//	    upstream_host preserve|localhost
//	}
func parsePreviewHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var ph PreviewHandler
	err := ph.UnmarshalCaddyfile(h.Dispenser)
	return &ph, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens.
func (h *PreviewHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if ok, err := h.Config.unmarshalSub(d); err != nil {
			return err
		} else if ok {
			continue
		}
		switch d.Val() {
		case "upstream_host":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.UpstreamHost = d.Val()
		default:
			return d.Errf("unrecognized porthole_preview option %q", d.Val())
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the upstream source: `dynamic porthole { data_dir … domain … }`.
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	for d.NextBlock(0) {
		if ok, err := u.Config.unmarshalSub(d); err != nil {
			return err
		} else if !ok {
			return d.Errf("unrecognized porthole upstreams option %q", d.Val())
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the permission: `permission porthole { data_dir … domain … }`.
func (p *Permission) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // module name
	for d.NextBlock(0) {
		if ok, err := p.Config.unmarshalSub(d); err != nil {
			return err
		} else if !ok {
			return d.Errf("unrecognized porthole permission option %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*PreviewHandler)(nil)
	_ caddyfile.Unmarshaler = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler = (*Permission)(nil)
)
