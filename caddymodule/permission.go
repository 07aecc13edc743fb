package caddymodule

import (
	"context"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	"github.com/porthole-dev/porthole/previewproxy"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(Permission{})
}

// Permission allows on-demand certificates only for preview hosts of live sandboxes, answered from
// the route table in memory (a miss asks sandboxd once, then is cached negatively).
type Permission struct {
	Config
	table *previewproxy.Table
	log   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Permission) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "tls.permission.porthole", New: func() caddy.Module { return new(Permission) }}
}

// Provision sets up the permission module.
func (p *Permission) Provision(ctx caddy.Context) error {
	p.log = ctx.Logger()
	if err := p.Config.defaults(); err != nil {
		return err
	}
	t, err := p.Config.acquire(p.log)
	if err != nil {
		return err
	}
	p.table = t
	return registerMetrics(ctx.GetMetricsRegistry())
}

// Cleanup releases the shared table.
func (p *Permission) Cleanup() error {
	p.Config.release()
	return nil
}

// CertificateAllowed allows name only if it is the preview host of a live sandbox.
func (p *Permission) CertificateAllowed(ctx context.Context, name string) error {
	live := p.table.Live(ctx, name)
	if live {
		edgeCertDecisions.WithLabelValues("allowed").Inc()
		return nil
	}
	edgeCertDecisions.WithLabelValues("denied").Inc()
	return fmt.Errorf("porthole: %q is not the preview host of a live sandbox", name)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Permission)(nil)
	_ caddy.CleanerUpper          = (*Permission)(nil)
	_ caddytls.OnDemandPermission = (*Permission)(nil)
)
