package capacity

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

func load(queued int64, perTier ...float64) policy.Measured {
	m := policy.Measured{Queued: queued, OfferedLoad: map[string]float64{}}
	for i, v := range perTier {
		m.OfferedLoad[[]string{"premium", "standard", "free"}[i]] = v
	}
	return m
}

func TestDesiredReplicas(t *testing.T) {
	type row struct {
		Load    string
		Queued  int64
		Needed  int64
		Desired int32
	}
	tests := map[string]struct {
		pool    *v1alpha1.ModelPool
		s       time.Duration
		reports []policy.Measured
		want    row
	}{
		"no reports, no autoscaling: 0": {seed.Pool(), 6 * time.Second, nil, row{"0", 0, 0, 0}},
		"no reports, minReplicas 2: 2":  {seed.Pool(seed.WithAutoscaling(2, 10, "")), 6 * time.Second, nil, row{"0", 0, 0, 2}},
		// 4/s × 6s = 24 busy slots; 4 per replica at 0.8 is 7.5 replicas.
		"the seed's 4 req/s at the default 0.8: ⌈7.5⌉ = 8": {seed.Pool(), 6 * time.Second,
			[]policy.Measured{load(0, 1, 1, 2)}, row{"4", 0, 8, 8}},
		"utilization 1 keeps an exact 6": {seed.Pool(seed.WithAutoscaling(0, 10, "1")), 6 * time.Second,
			[]policy.Measured{load(0, 4)}, row{"4", 0, 6, 6}},
		"utilization 800m is 0.8": {seed.Pool(seed.WithAutoscaling(0, 10, "800m")), 6 * time.Second,
			[]policy.Measured{load(0, 4)}, row{"4", 0, 8, 8}},
		"dispatchers add up: 2 × 2 req/s is 4": {seed.Pool(), 6 * time.Second,
			[]policy.Measured{load(0, 2), load(0, 0, 2)}, row{"4", 0, 8, 8}},
		// A float64 sum says 0.30000000000000004 × 10s / 3 = 1.0000000000000002.
		"exact: 0.1 + 0.2 req/s × 10s over 3 slots is 1, not 2": {
			seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ConcurrencyPerReplica = 3 }, seed.WithAutoscaling(0, 10, "1")), 10 * time.Second,
			[]policy.Measured{load(0, 0.1, 0.2)}, row{"0.3", 0, 1, 1}},
		"a held request wakes a pool with no load measured yet": {seed.Pool(seed.WithAutoscaling(0, 10, "")), 6 * time.Second,
			[]policy.Measured{load(0), load(1)}, row{"0", 1, 0, 1}},
		"a trickle rounds up to one replica": {seed.Pool(seed.WithAutoscaling(0, 10, "")), 6 * time.Second,
			[]policy.Measured{load(0, 0.001)}, row{"0.001", 0, 1, 1}},
		"clamped to maxReplicas": {seed.Pool(seed.WithAutoscaling(0, 3, "")), 6 * time.Second,
			[]policy.Measured{load(50, 40)}, row{"40", 50, 75, 3}},
		"no max without autoscaling": {seed.Pool(), 6 * time.Second,
			[]policy.Measured{load(50, 40)}, row{"40", 50, 75, 75}},
		"broken rates are left out": {seed.Pool(), 6 * time.Second,
			[]policy.Measured{load(-3, math.NaN(), math.Inf(1), -2), load(0, 0, 0, 4)}, row{"4", 0, 8, 8}},
		"an absurd rate saturates at the int32 range": {seed.Pool(), 6 * time.Second,
			[]policy.Measured{load(0, 1e300)}, row{"4611686018427.388", 0, maxInt32, maxInt32}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := DesiredReplicas(DemandInput{Pool: tc.pool, ServiceTime: tc.s, Reports: tc.reports})
			if err != nil {
				t.Fatal(err)
			}
			got := row{d.OfferedLoadString, d.Queued, d.Needed, d.Replicas}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("demand (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDesiredReplicasLeavesItsInputAlone(t *testing.T) {
	pool := seed.Pool(seed.WithAutoscaling(0, 4, ""))
	if _, err := DesiredReplicas(DemandInput{Pool: pool, ServiceTime: time.Second}); err != nil {
		t.Fatal(err)
	}
	if pool.Spec.Autoscaling.TargetUtilization != nil {
		t.Errorf("targetUtilization defaulted in the caller's pool: %v", pool.Spec.Autoscaling.TargetUtilization)
	}
}

func TestDesiredReplicasInvalidInput(t *testing.T) {
	tests := map[string]struct {
		in      DemandInput
		wantMsg string
	}{
		"no pool": {DemandInput{ServiceTime: time.Second}, "invalid bounds input: no pool"},
		"zero concurrency and service time": {
			DemandInput{Pool: seed.Pool(func(p *v1alpha1.ModelPool) { p.Spec.ConcurrencyPerReplica = 0 })},
			"invalid bounds input: spec.concurrencyPerReplica: 0 must be at least 1; serviceTime: 0s must be greater than 0",
		},
		"min above max": {
			DemandInput{Pool: seed.Pool(seed.WithAutoscaling(5, 2, "")), ServiceTime: time.Second},
			"invalid bounds input: spec.autoscaling.minReplicas: 5 must not exceed maxReplicas 2",
		},
		"negative min, zero max": {
			DemandInput{Pool: seed.Pool(seed.WithAutoscaling(-1, 0, "")), ServiceTime: time.Second},
			"invalid bounds input: spec.autoscaling.minReplicas: -1 must not be negative; spec.autoscaling.maxReplicas: 0 must be at least 1",
		},
		"utilization 0": {
			DemandInput{Pool: seed.Pool(seed.WithAutoscaling(0, 2, "0")), ServiceTime: time.Second},
			"invalid bounds input: spec.autoscaling.targetUtilization: 0 must be greater than 0 and at most 1",
		},
		"utilization above 1": {
			DemandInput{Pool: seed.Pool(seed.WithAutoscaling(0, 2, "1.5")), ServiceTime: time.Second},
			"invalid bounds input: spec.autoscaling.targetUtilization: 1500m must be greater than 0 and at most 1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := DesiredReplicas(tc.in)
			if !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("err = %v, want ErrInvalidInput", err)
			}
			if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
	// ComputeBounds refuses the same autoscaling mistakes.
	_, err := ComputeBounds(BoundsInput{Pool: seed.Pool(seed.WithAutoscaling(5, 2, ""))})
	if want := "invalid bounds input: spec.autoscaling.minReplicas: 5 must not exceed maxReplicas 2"; err == nil || err.Error() != want {
		t.Errorf("ComputeBounds err = %v, want %q", err, want)
	}
}
