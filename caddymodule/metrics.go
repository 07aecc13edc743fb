package caddymodule

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are package-level so their values survive config reloads; each config's registry gets
// them registered again (an already-registered collector is fine), as Caddy's own modules do.
var (
	edgeRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "porthole", Subsystem: "edge", Name: "requests_total",
		Help: "Preview requests by outcome: proxied, not_found, private, waking, waiting_for_port.",
	}, []string{"outcome"})
	edgeResolves = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "porthole", Subsystem: "edge", Name: "resolves_total",
		Help: "Route table misses answered by asking sandboxd.",
	})
	edgeCertDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "porthole", Subsystem: "edge", Name: "certificate_decisions_total",
		Help: "On-demand TLS permission answers: allowed, denied.",
	}, []string{"decision"})
)

func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{edgeRequests, edgeResolves, edgeCertDecisions} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}
