// Package challtestdns is a Caddy DNS provider (dns.providers.challtestsrv) that publishes ACME
// DNS-01 TXT records through pebble-challtestsrv's management API. It exists for the tests of the
// wildcard path against Pebble; the production bin/caddy does not include it.
package challtestdns

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/libdns/libdns"
)

func init() { caddy.RegisterModule(Provider{}) }

// Provider talks to challtestsrv's management API at URL.
type Provider struct {
	URL string `json:"url,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Provider) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "dns.providers.challtestsrv", New: func() caddy.Module { return new(Provider) }}
}

// UnmarshalCaddyfile reads `challtestsrv <management URL>`.
func (p *Provider) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	p.URL = d.Val()
	return nil
}

func fqdn(name, zone string) string {
	if strings.HasSuffix(name, ".") {
		return name
	}
	return libdns.AbsoluteName(name, zone)
}

func (p *Provider) post(ctx context.Context, path string, body any) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", strings.TrimSuffix(p.URL, "/")+path, bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("challtestsrv %s: status %d", path, resp.StatusCode)
	}
	return nil
}

// AppendRecords publishes TXT records.
func (p *Provider) AppendRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	for _, r := range recs {
		rr := r.RR()
		if rr.Type != "TXT" {
			return nil, fmt.Errorf("challtestsrv: only TXT records, not %s", rr.Type)
		}
		if err := p.post(ctx, "/set-txt", map[string]string{"host": fqdn(rr.Name, zone), "value": rr.Data}); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// DeleteRecords removes TXT records.
func (p *Provider) DeleteRecords(ctx context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	for _, r := range recs {
		if err := p.post(ctx, "/clear-txt", map[string]string{"host": fqdn(r.RR().Name, zone)}); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// Interface guards
var (
	_ libdns.RecordAppender = (*Provider)(nil)
	_ libdns.RecordDeleter  = (*Provider)(nil)
	_ caddyfile.Unmarshaler = (*Provider)(nil)
)
