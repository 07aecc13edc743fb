package caddymodule

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func httpcaddyfileServerType() caddyfile.ServerType { return httpcaddyfile.ServerType{} }
