package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/tiergate/tiergate/capacity"
)

// Controller metrics (docs/architecture.md#metrics), served by the manager's metrics
// endpoint. Labels never name a tenant. The pool label is "namespace/name",
// the same value the dispatchers' metrics carry (Policy.Pool), so rules can
// join the two on (pool, tier).
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
	poolDesiredReplicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tiergate_pool_desired_replicas",
		Help: "Replicas the offered load needs by Little's law (status.desiredReplicas), by ModelPool (namespace/name); the KEDA ScaledObject of spec.autoscaling scales the model Deployment to it.",
	}, []string{"pool"})
	tierMaxWait = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tiergate_tier_max_wait_seconds",
		Help: "Stated guarantee of a ServiceTier (status.maxWait), by ModelPool (namespace/name) and tier; absent while the pool has no ready replicas.",
	}, []string{"pool", "tier"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(pushTotal, pushLatency, poolConcurrency, poolDesiredReplicas, tierMaxWait)
}

// exportPoolMetrics sets a pool's gauges from its bounds and demand: the
// concurrency, the desired replicas, and the same maxWait its tiers' status
// states (desiredTierStatus). It returns the tiers whose maxWait series it
// exports.
func exportPoolMetrics(pool string, exported map[string]bool, b capacity.Bounds, d capacity.Demand) map[string]bool {
	poolConcurrency.WithLabelValues(pool).Set(float64(b.Pool.Concurrency))
	poolDesiredReplicas.WithLabelValues(pool).Set(float64(d.Replicas))
	return setTierMaxWait(tierMaxWait, pool, exported, b.Tiers)
}

// forgetPoolMetrics deletes every series of a pool that went away.
func forgetPoolMetrics(pool string) {
	poolConcurrency.DeleteLabelValues(pool)
	poolDesiredReplicas.DeleteLabelValues(pool)
	deleteTierMaxWait(tierMaxWait, pool)
}

// setTierMaxWait exports the stated maxWait of the pool's tiers and deletes
// the series of the tiers in exported that are gone or have no guarantee
// now. It returns the tiers exported. Only changed tiers are deleted, so a
// scrape never sees a current tier missing.
func setTierMaxWait(g *prometheus.GaugeVec, pool string, exported map[string]bool, tiers []capacity.TierBounds) map[string]bool {
	now := make(map[string]bool, len(tiers))
	for _, t := range tiers {
		if t.Unbounded {
			continue
		}
		g.WithLabelValues(pool, t.Name).Set(t.MaxWait.Seconds())
		now[t.Name] = true
	}
	for name := range exported {
		if !now[name] {
			g.DeleteLabelValues(pool, name)
		}
	}
	return now
}

// deleteTierMaxWait deletes every tier series of a pool that went away.
func deleteTierMaxWait(g *prometheus.GaugeVec, pool string) {
	g.DeletePartialMatch(prometheus.Labels{"pool": pool})
}
