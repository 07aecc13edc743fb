// Package previewproxy holds the edge's logic with no Caddy types: preview host parsing, the route
// table and its feed from sandboxd, and the preview policy.
package previewproxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Target is what a preview host names: a port inside a sandbox.
type Target struct {
	Port      int
	SandboxID string
}

// ErrNotPreviewHost is returned for any host that is not strictly <port>-<sandboxId>.<domain>.
var ErrNotPreviewHost = errors.New("not a preview host")

// Sandbox ids are lowercase [a-z0-9], no hyphen; Porthole's are 26 characters (128 bits). Accept
// 16 to 63 so ids of other lengths still parse, and nothing longer than a DNS label.
const (
	minIDLen = 16
	maxIDLen = 63
)

// ParseHost parses a request's Host (or a TLS SNI) as <port>-<sandboxId>.<domain>. An optional
// :port suffix is ignored. ASCII letters are lowercased first; anything else that is not exactly
// that shape — leading zeros, a port out of range, extra labels, a trailing dot, IP literals,
// non-ASCII — is ErrNotPreviewHost.
func ParseHost(host, domain string) (Target, error) {
	if len(host) > 253 || domain == "" {
		return Target{}, ErrNotPreviewHost
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host, "]") {
		if _, err := strconv.ParseUint(host[i+1:], 10, 16); err != nil {
			return Target{}, ErrNotPreviewHost
		}
		host = host[:i]
	}
	host = asciiLower(host)
	domain = asciiLower(domain)
	if host == "" {
		return Target{}, ErrNotPreviewHost
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return Target{}, ErrNotPreviewHost
		}
	}
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || strings.Contains(label, ".") {
		return Target{}, ErrNotPreviewHost
	}
	portStr, id, ok := strings.Cut(label, "-")
	if !ok || len(portStr) == 0 || len(portStr) > 5 || portStr[0] == '0' {
		return Target{}, ErrNotPreviewHost
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return Target{}, ErrNotPreviewHost
	}
	if len(id) < minIDLen || len(id) > maxIDLen {
		return Target{}, ErrNotPreviewHost
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return Target{}, ErrNotPreviewHost
		}
	}
	return Target{Port: port, SandboxID: id}, nil
}

// Host returns the preview host of t under domain.
func (t Target) Host(domain string) string {
	return fmt.Sprintf("%d-%s.%s", t.Port, t.SandboxID, domain)
}

func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
