package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Controller metrics (DESIGN.md section 9), served by the manager's metrics
// endpoint. Labels never name a tenant.
var (
	pushTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tiergate_push_total",
		Help: "Policy pushes to dispatcher pods, by result (success, unauthorized, rejected, conflict, unreachable, error).",
	}, []string{"result"})
	pushLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tiergate_push_latency_seconds",
		Help:    "Duration of one policy push attempt, successful or not.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	poolConcurrency = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tiergate_pool_concurrency",
		Help: "Pool concurrency P = readyReplicas × concurrencyPerReplica, by ModelPool (namespace/name).",
	}, []string{"pool"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(pushTotal, pushLatency, poolConcurrency)
}
