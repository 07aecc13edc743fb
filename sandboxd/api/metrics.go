package api

import (
	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are sandboxd's Prometheus collectors, on a registry of their own (no global state).
type metrics struct {
	registry    *prometheus.Registry
	runs        *prometheus.CounterVec
	runDuration *prometheus.HistogramVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "porthole", Name: "runs_total",
			Help: "Runs by language and outcome (ok, error, timeout, oom, exited, too_large, canceled).",
		}, []string{"language", "outcome"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "porthole", Name: "run_duration_seconds",
			Help:    "Time from handing the code to a sandbox to its answer.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20},
		}, []string{"language"}),
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.runs, m.runDuration,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "porthole", Name: "run_queue_depth", Help: "Runs admitted and waiting for a slot."},
			func() float64 { return float64(s.limiter.queued()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "porthole", Name: "runs_in_flight", Help: "Runs holding a slot."},
			func() float64 { return float64(s.limiter.running()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "porthole", Name: "sandboxes_alive", Help: "Sandboxes that exist now: warm, running or being removed."},
			func() float64 { return float64(s.rt.Alive()) }),
	)
	m.registry.MustRegister(&sessionCollector{s: s})
	for _, lang := range runtime.Languages {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "porthole", Name: "warm_sandboxes", Help: "Pre-started sandboxes ready for a run.",
			ConstLabels: prometheus.Labels{"language": string(lang)},
		}, func() float64 { return float64(s.pool.Ready(lang)) }))
		for _, o := range []string{"ok", "error", "timeout", "oom", "exited", "too_large", "canceled"} {
			m.runs.WithLabelValues(string(lang), o) // export zeros, so rates work from the first run
		}
	}
	return m
}

// sessionCollector exports the maintenance job's and the lifecycle's counters, read from the
// session manager at scrape time.
type sessionCollector struct{ s *Server }

var actionsDesc = prometheus.NewDesc("porthole_session_actions_total",
	"Session lifecycle and maintenance actions: created, deleted, resumed, reaped_no_record, marked_lost, stopped_idle, stopped_lifetime, removed_unfinished, removed_orphan_files.",
	[]string{"action"}, nil)

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- actionsDesc }

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.sessions == nil {
		return
	}
	counts := c.s.sessions.Counts()
	for _, a := range []string{"created", "deleted", "resumed", "reaped_no_record", "marked_lost", "stopped_idle", "stopped_lifetime", "removed_unfinished", "removed_orphan_files"} {
		ch <- prometheus.MustNewConstMetric(actionsDesc, prometheus.CounterValue, float64(counts[a]), a)
	}
}
