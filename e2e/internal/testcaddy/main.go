// Command testcaddy is bin/caddy plus the test DNS provider for Pebble's challenge server: the build
// the DNS-01 wildcard test runs.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/porthole-dev/porthole/caddymodule"
	_ "github.com/porthole-dev/porthole/e2e/internal/challtestdns"
)

func main() { caddycmd.Main() }
