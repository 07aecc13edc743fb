// Package caddymodule adapts Porthole's edge logic (previewproxy) to Caddy: a handler for preview
// policy, a dynamic upstream source, an on-demand TLS permission, and their Caddyfile syntax. It is
// thin on purpose: decisions live in previewproxy.
package caddymodule

import (
	"context"
	"fmt"
	"os"

	"github.com/caddyserver/caddy/v2"
	"github.com/porthole-dev/porthole/previewproxy"
	"go.uber.org/zap"
)

// tables holds one route table per (sandboxd data dir, preview domain), shared by every module that
// names them and kept across config reloads: a reload does not drop the table or its stream.
var tables = caddy.NewUsagePool()

type sharedTable struct {
	*previewproxy.Table
	cancel context.CancelFunc
}

func (s *sharedTable) Destruct() error {
	s.cancel()
	return nil
}

// Config names the sandboxd an edge module talks to.
type Config struct {
	// DataDir is sandboxd's data dir, where its internal socket and per-port sockets are.
	// Default: the environment variable PORTHOLE_DATA_DIR.
	DataDir string `json:"data_dir,omitempty"`
	// Domain is the preview domain. Default: PORTHOLE_PREVIEW_DOMAIN, else "preview.localhost".
	Domain string `json:"domain,omitempty"`
}

func (c *Config) defaults() error {
	if c.DataDir == "" {
		c.DataDir = os.Getenv("PORTHOLE_DATA_DIR")
	}
	if c.Domain == "" {
		c.Domain = os.Getenv("PORTHOLE_PREVIEW_DOMAIN")
	}
	if c.Domain == "" {
		c.Domain = "preview.localhost"
	}
	if c.DataDir == "" {
		return fmt.Errorf("porthole: data_dir is required (sandboxd's data dir), or set PORTHOLE_DATA_DIR")
	}
	return nil
}

func (c Config) key() string { return c.DataDir + "|" + c.Domain }

// acquire returns the shared table for c, starting it (and its route stream) on first use.
func (c Config) acquire(log *zap.Logger) (*previewproxy.Table, error) {
	v, _, err := tables.LoadOrNew(c.key(), func() (caddy.Destructor, error) {
		ctx, cancel := context.WithCancel(context.Background())
		t := previewproxy.NewTable(c.Domain, previewproxy.NewSandboxd(c.DataDir), log)
		t.OnResolve = edgeResolves.Inc
		go t.Follow(ctx)
		return &sharedTable{Table: t, cancel: cancel}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*sharedTable).Table, nil
}

func (c Config) release() { _, _ = tables.Delete(c.key()) }
