// Command caddy is Caddy with Porthole's modules: the preview edge.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// Porthole's modules.
	_ "github.com/porthole-dev/porthole/caddymodule"
)

func main() {
	caddycmd.Main()
}
