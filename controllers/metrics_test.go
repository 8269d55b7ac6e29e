package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/tiergate/tiergate/capacity"
)

const maxWaitHeader = `# HELP tiergate_tier_max_wait_seconds Stated guarantee of a ServiceTier (status.maxWait), by ModelPool (namespace/name) and tier; absent while the pool has no ready replicas.
# TYPE tiergate_tier_max_wait_seconds gauge
`

func stated(name string, maxWait time.Duration) capacity.TierBounds {
	return capacity.TierBounds{Name: name, MaxWait: maxWait}
}

func unbounded(name string) capacity.TierBounds {
	return capacity.TierBounds{Name: name, Unbounded: true}
}

func TestTierMaxWaitSeries(t *testing.T) {
	type step struct {
		pool   string
		tiers  []capacity.TierBounds
		forget bool // the pool went away
		want   string
	}
	seed := []capacity.TierBounds{stated("premium", 91*time.Second), stated("standard", 151*time.Second), stated("free", 211*time.Second)}
	tests := map[string][]step{
		"set, change, delete a tier, delete the pool": {
			{pool: "ns/llm", tiers: seed, want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="free"} 211
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="premium"} 91
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="standard"} 151
`},
			// Half the replicas: the drain term doubles.
			{pool: "ns/llm", tiers: []capacity.TierBounds{stated("premium", 176*time.Second), stated("standard", 236*time.Second), stated("free", 296500*time.Millisecond)}, want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="free"} 296.5
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="premium"} 176
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="standard"} 236
`},
			{pool: "ns/llm", tiers: []capacity.TierBounds{stated("premium", 176*time.Second), stated("free", 296500*time.Millisecond)}, want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="free"} 296.5
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="premium"} 176
`},
			{pool: "ns/llm", forget: true, want: ``},
		},
		"no ready replicas states no guarantee, and it comes back": {
			{pool: "ns/llm", tiers: seed[:2], want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="premium"} 91
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="standard"} 151
`},
			{pool: "ns/llm", tiers: []capacity.TierBounds{unbounded("premium"), unbounded("standard")}, want: ``},
			{pool: "ns/llm", tiers: seed[:1], want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="premium"} 91
`},
		},
		"a tier renamed, and no tiers at all": {
			{pool: "ns/llm", tiers: seed[:1], want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="premium"} 91
`},
			{pool: "ns/llm", tiers: []capacity.TierBounds{stated("gold", 91*time.Second)}, want: `
tiergate_tier_max_wait_seconds{pool="ns/llm",tier="gold"} 91
`},
			{pool: "ns/llm", tiers: nil, want: ``},
		},
		"pools are independent": {
			{pool: "a/llm", tiers: seed[:1], want: `
tiergate_tier_max_wait_seconds{pool="a/llm",tier="premium"} 91
`},
			{pool: "b/llm", tiers: seed[:1], want: `
tiergate_tier_max_wait_seconds{pool="a/llm",tier="premium"} 91
tiergate_tier_max_wait_seconds{pool="b/llm",tier="premium"} 91
`},
			{pool: "b/llm", tiers: nil, want: `
tiergate_tier_max_wait_seconds{pool="a/llm",tier="premium"} 91
`},
			// A pool whose name prefixes another's keeps its series.
			{pool: "a/llm-2", tiers: seed[:1], want: `
tiergate_tier_max_wait_seconds{pool="a/llm",tier="premium"} 91
tiergate_tier_max_wait_seconds{pool="a/llm-2",tier="premium"} 91
`},
			{pool: "a/llm", forget: true, want: `
tiergate_tier_max_wait_seconds{pool="a/llm-2",tier="premium"} 91
`},
		},
	}
	for name, steps := range tests {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tiergate_tier_max_wait_seconds", Help: "h"}, []string{"pool", "tier"})
			reg.MustRegister(g)
			exported := map[string]map[string]bool{}
			for i, s := range steps {
				if s.forget {
					deleteTierMaxWait(g, s.pool)
					delete(exported, s.pool)
				} else {
					exported[s.pool] = setTierMaxWait(g, s.pool, exported[s.pool], s.tiers)
				}
				want := ""
				if s.want != "" {
					want = "# HELP tiergate_tier_max_wait_seconds h\n# TYPE tiergate_tier_max_wait_seconds gauge" + s.want
				}
				if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tiergate_tier_max_wait_seconds"); err != nil {
					t.Errorf("step %d: %v", i, err)
				}
			}
		})
	}
}

// The real gauge is served by the manager's metrics endpoint.
func TestTierMaxWaitRegistered(t *testing.T) {
	const pool = "metrics-test/registered"
	t.Cleanup(func() { deleteTierMaxWait(tierMaxWait, pool) })
	setTierMaxWait(tierMaxWait, pool, nil, []capacity.TierBounds{stated("premium", 2500*time.Millisecond)})
	want := maxWaitHeader + `tiergate_tier_max_wait_seconds{pool="metrics-test/registered",tier="premium"} 2.5
`
	if err := testutil.GatherAndCompare(ctrlmetrics.Registry, strings.NewReader(want), "tiergate_tier_max_wait_seconds"); err != nil {
		t.Error(err)
	}
}
