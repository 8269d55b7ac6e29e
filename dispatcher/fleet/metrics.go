package fleet

import "github.com/prometheus/client_golang/prometheus"

// Operation labels of tiergate_state_op_duration_seconds and
// tiergate_state_errors_total.
const (
	opEnqueue  = "enqueue"
	opExchange = "exchange" // returns and claims of the queue's pump
	opRenew    = "renew"
	opFlush    = "flush" // removals outside an exchange: replayed, or of another pool
	opLeave    = "leave"
	opReserve  = "reserve" // a token budget reservation (Budgets)
	opSettle   = "settle"  // a token budget settlement (Budgets)
)

// Wake-up sources of tiergate_state_wakeups_total.
const (
	wakePubSub     = "pubsub"     // another dispatcher released a slot
	wakeTimer      = "timer"      // the bounded re-check of a blocked queue
	wakeTransition = "transition" // Redis lost or regained
	wakeResub      = "resubscribe"
)

type metrics struct {
	ops      *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	wakeups  *prometheus.CounterVec
	restored prometheus.Counter
	inflight prometheus.Gauge
	// degraded, dispatchers and leases are read from the Gate at scrape time.
	funcs []prometheus.Collector
}

func newMetrics(g *Redis) *metrics {
	m := &metrics{
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tiergate_state_op_duration_seconds",
			Help:    "Duration of one Redis round trip of the fleet state, by operation.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1},
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_state_errors_total",
			Help: "Redis calls of the fleet state that failed, by operation.",
		}, []string{"op"}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_state_wakeups_total",
			Help: "Times the queue was asked to re-check the fleet, by source.",
		}, []string{"source"}),
		restored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tiergate_state_leases_restored_total",
			Help: "Leases this dispatcher still held that Redis had lost (outage, restart or a renewal too late) and that it wrote back.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tiergate_state_ops_in_flight",
			Help: "Redis round trips of the fleet state under way now; with a slow Redis they pile up here, not in the queue.",
		}),
	}
	m.funcs = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tiergate_state_degraded",
			Help: "1 while Redis is unreachable and this dispatcher enforces only its slice of the pool-wide limits.",
		}, func() float64 {
			if g.status().Degraded {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tiergate_state_dispatchers",
			Help: "Live dispatchers of the pool as Redis last listed them (the divisor of the degraded slice).",
		}, func() float64 { return float64(g.status().FleetSize) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "tiergate_state_leases",
			Help:        "Leases this dispatcher holds, by kind.",
			ConstLabels: prometheus.Labels{"kind": "slot"},
		}, func() float64 { return float64(g.status().Slots) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "tiergate_state_leases",
			Help:        "Leases this dispatcher holds, by kind.",
			ConstLabels: prometheus.Labels{"kind": "queued"},
		}, func() float64 { return float64(g.status().Queued) }),
	}
	for _, op := range []string{opEnqueue, opExchange, opRenew, opFlush, opLeave, opReserve, opSettle} {
		m.errors.WithLabelValues(op)
	}
	for _, s := range []string{wakePubSub, wakeTimer, wakeTransition, wakeResub} {
		m.wakeups.WithLabelValues(s)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return append([]prometheus.Collector{m.ops, m.errors, m.wakeups, m.restored, m.inflight}, m.funcs...)
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range m.collectors() {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Describe implements prometheus.Collector: the tiergate_state_* metrics.
func (g *Redis) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range g.m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (g *Redis) Collect(ch chan<- prometheus.Metric) {
	for _, c := range g.m.collectors() {
		c.Collect(ch)
	}
}
