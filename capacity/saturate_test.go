package capacity

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// longestCRD is the longest duration the CRD's duration() rule accepts:
// CEL durations span the int64 nanoseconds, like time.Duration.
const longestCRD = time.Duration(1<<63 - 1)

// maxBase is the CRD's largest basePriority.
const maxBase = 1000000

// At the CRD's extremes (the seed's pool, C=4 and S=6s unless changed,
// one replica: each 5s tier has L=3, so a top-tier maxWait is 6×6s/4 + 6s
// = 15s) the horizon and maxWait saturate at the longest
// Duration instead of wrapping around to negative or small values, and the
// warnings that compare them with the client timeout still fire.
func TestSaturatingArithmeticAtTheCRDMaxima(t *testing.T) {
	type row struct {
		Horizon                time.Duration
		HorizonExceeds         bool
		MaxWaits               []time.Duration
		MaxWaitExceeds         []bool
		HorizonSaysSaturated   bool
		GuaranteeSaysSaturated bool
	}
	twoTiers := []v1alpha1.ServiceTier{seed.Tier("top", 0, 5*time.Second, "1"), seed.Tier("bottom", maxBase, 5*time.Second, "1")}
	tests := map[string]struct {
		mutate   func(*v1alpha1.ModelPool)
		tiers    []v1alpha1.ServiceTier
		replicas int32
		want     row
	}{
		"the longest ageing rate across the widest spread": {
			mutate: func(p *v1alpha1.ModelPool) {
				p.Spec.Ageing = v1alpha1.Ageing{Rate: seed.Duration(longestCRD)}
				p.Spec.ClientTimeout = seed.Duration(30 * time.Second)
			},
			tiers: twoTiers, replicas: 1,
			want: row{Horizon: longestCRD, HorizonExceeds: true,
				MaxWaits: []time.Duration{15 * time.Second, longestCRD}, MaxWaitExceeds: []bool{false, true},
				HorizonSaysSaturated: true, GuaranteeSaysSaturated: true},
		},
		"ten hours per point across the widest spread (3.6e10s, past int64 ns)": {
			mutate: func(p *v1alpha1.ModelPool) {
				p.Spec.Ageing = v1alpha1.Ageing{Rate: seed.Duration(10 * time.Hour)}
				p.Spec.ClientTimeout = seed.Duration(longestCRD)
			},
			tiers: twoTiers, replicas: 1,
			want: row{Horizon: longestCRD, HorizonExceeds: true,
				MaxWaits: []time.Duration{15 * time.Second, longestCRD}, MaxWaitExceeds: []bool{false, true},
				HorizonSaysSaturated: true, GuaranteeSaysSaturated: true},
		},
		"the longest service time": {
			mutate: func(p *v1alpha1.ModelPool) {
				p.Spec.ServiceTime.Mean.Duration = longestCRD
				p.Spec.ClientTimeout = seed.Duration(longestCRD)
			},
			tiers: []v1alpha1.ServiceTier{seed.Tier("only", 0, longestCRD, "1")}, replicas: 1,
			want: row{Horizon: 0, MaxWaits: []time.Duration{longestCRD}, MaxWaitExceeds: []bool{true},
				HorizonSaysSaturated: true, GuaranteeSaysSaturated: true}, // the client timeout is saturated
		},
		"the longest starvation bound over one point": {
			mutate: func(p *v1alpha1.ModelPool) {
				p.Spec.Ageing = v1alpha1.Ageing{StarvationBound: seed.Duration(longestCRD)}
				p.Spec.ClientTimeout = seed.Duration(longestCRD - 1)
			},
			tiers:    []v1alpha1.ServiceTier{seed.Tier("top", 0, 5*time.Second, "1"), seed.Tier("bottom", 1, 5*time.Second, "1")},
			replicas: 1,
			want: row{Horizon: longestCRD, HorizonExceeds: true,
				MaxWaits: []time.Duration{15 * time.Second, longestCRD}, MaxWaitExceeds: []bool{false, true},
				HorizonSaysSaturated: true, GuaranteeSaysSaturated: true},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b, err := ComputeBounds(BoundsInput{Pool: seed.Pool(tc.mutate), ReadyReplicas: tc.replicas, Tiers: tc.tiers, Dispatchers: 1})
			if err != nil {
				t.Fatal(err)
			}
			got := row{Horizon: b.Pool.AgeingHorizon, HorizonExceeds: b.Pool.HorizonExceedsClientTimeout,
				HorizonSaysSaturated: strings.Contains(HorizonMessage(b.Pool), "more than 292 years")}
			for _, tb := range b.Tiers {
				got.MaxWaits = append(got.MaxWaits, tb.MaxWait)
				got.MaxWaitExceeds = append(got.MaxWaitExceeds, tb.MaxWaitExceedsClientTimeout)
				if tb.MaxWait < 0 {
					t.Errorf("tier %s: negative maxWait %s", tb.Name, tb.MaxWait)
				}
				got.GuaranteeSaysSaturated = got.GuaranteeSaysSaturated || strings.Contains(tb.Guarantee, "waits at most more than 292 years")
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if b.Pool.HorizonExceedsClientTimeout && !strings.Contains(HorizonMessage(b.Pool), "exceeds clientTimeout") {
				t.Errorf("the warning's message does not say so: %s", HorizonMessage(b.Pool))
			}
		})
	}
}
