package capacity

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

func TestApplyDefaults(t *testing.T) {
	tests := map[string]struct {
		in, want v1alpha1.ModelPoolSpec
	}{
		"every defaulted field unset": {
			in: v1alpha1.ModelPoolSpec{},
			want: v1alpha1.ModelPoolSpec{
				ServiceTime:    v1alpha1.ServiceTime{Source: v1alpha1.ServiceTimeDeclared},
				Authentication: v1alpha1.Authentication{Mode: v1alpha1.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
				SharedState:    v1alpha1.SharedStateLocal,
				Backend:        v1alpha1.Backend{Scheme: "http"},
				Dispatchers:    v1alpha1.Dispatchers{AdminPort: 9090},
			},
		},
		"set fields are kept, and ageing is left alone": {
			in: v1alpha1.ModelPoolSpec{
				ServiceTime:    v1alpha1.ServiceTime{Source: v1alpha1.ServiceTimeMeasured},
				Authentication: v1alpha1.Authentication{Mode: v1alpha1.AuthAPIKey, HeaderName: "X-Org"},
				SharedState:    v1alpha1.SharedStateRedis,
				Backend:        v1alpha1.Backend{Port: 8000, Scheme: "https"},
				Dispatchers:    v1alpha1.Dispatchers{AdminPort: 9999},
			},
			want: v1alpha1.ModelPoolSpec{
				ServiceTime:    v1alpha1.ServiceTime{Source: v1alpha1.ServiceTimeMeasured},
				Authentication: v1alpha1.Authentication{Mode: v1alpha1.AuthAPIKey, HeaderName: "X-Org"},
				SharedState:    v1alpha1.SharedStateRedis,
				Backend:        v1alpha1.Backend{Port: 8000, Scheme: "https"},
				Dispatchers:    v1alpha1.Dispatchers{AdminPort: 9999},
			},
		},
	}
	u8, u5 := resource.MustParse("0.8"), resource.MustParse("0.5")
	tests["autoscaling's targetUtilization defaults to 0.8"] = struct{ in, want v1alpha1.ModelPoolSpec }{
		in:   v1alpha1.ModelPoolSpec{Autoscaling: &v1alpha1.Autoscaling{MaxReplicas: 3}},
		want: withAutoscaling(tests["every defaulted field unset"].want, &v1alpha1.Autoscaling{MaxReplicas: 3, TargetUtilization: &u8}),
	}
	tests["a set targetUtilization is kept"] = struct{ in, want v1alpha1.ModelPoolSpec }{
		in:   v1alpha1.ModelPoolSpec{Autoscaling: &v1alpha1.Autoscaling{MaxReplicas: 3, TargetUtilization: &u5}},
		want: withAutoscaling(tests["every defaulted field unset"].want, &v1alpha1.Autoscaling{MaxReplicas: 3, TargetUtilization: &u5}),
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.in
			ApplyDefaults(&got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func withAutoscaling(spec v1alpha1.ModelPoolSpec, a *v1alpha1.Autoscaling) v1alpha1.ModelPoolSpec {
	spec.Autoscaling = a
	return spec
}

// TestComputeBoundsDefaultsACopy checks that a pool that was never
// defaulted gets the CRD's defaults in its policy, and that its spec is
// left as it was.
func TestComputeBoundsDefaultsACopy(t *testing.T) {
	pool := seed.Pool(func(p *v1alpha1.ModelPool) {
		p.Spec.ServiceTime.Source = ""
		p.Spec.Authentication = v1alpha1.Authentication{}
		p.Spec.SharedState = ""
		p.Spec.Ageing = v1alpha1.Ageing{}
		p.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 2}
	})
	before := pool.DeepCopy()
	got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: 1})
	if err != nil {
		t.Fatal(err)
	}
	pol := got.PolicyFor(0)
	gotDefaults := []any{got.Pool.ServiceTimeSource, got.Pool.AgeingRate, pol.Authentication.Mode, pol.Authentication.HeaderName, pol.SharedState}
	want := []any{v1alpha1.ServiceTimeDeclared, DefaultAgeingRate, "TrustedHeader", "X-Tenant-ID", "Local"}
	if diff := cmp.Diff(want, gotDefaults); diff != "" {
		t.Errorf("source, ageing rate, auth mode, header, shared state (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, pool); diff != "" {
		t.Errorf("ComputeBounds changed its input (-before +after):\n%s", diff)
	}
}

func TestHorizonMessage(t *testing.T) {
	tests := map[string]struct {
		pool PoolBounds
		want string
	}{
		"no client timeout": {PoolBounds{AgeingRate: 6 * time.Second, AgeingSpread: 20, AgeingHorizon: 2 * time.Minute},
			"ageing horizon 2m0s (6s per point × 20 points); no clientTimeout is set"},
		"within the client timeout": {PoolBounds{AgeingRate: 6 * time.Second, AgeingSpread: 20, AgeingHorizon: 2 * time.Minute, ClientTimeout: 3 * time.Minute},
			"ageing horizon 2m0s (6s per point × 20 points) is within clientTimeout 3m0s"},
		"beyond the client timeout": {PoolBounds{AgeingRate: 6 * time.Second, AgeingSpread: 20, AgeingHorizon: 2 * time.Minute, ClientTimeout: 30 * time.Second, HorizonExceedsClientTimeout: true},
			"ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s: under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void"},
		"one tier: no points": {PoolBounds{AgeingRate: 2 * time.Minute}, "ageing horizon 0s (2m0s per point × 0 points); no clientTimeout is set"},
		"a saturated horizon": {PoolBounds{AgeingRate: time.Hour, AgeingSpread: 1000000, AgeingHorizon: maxDuration, ClientTimeout: maxDuration, HorizonExceedsClientTimeout: true},
			"ageing horizon more than 292 years (1h0m0s per point × 1000000 points) exceeds clientTimeout more than 292 years: under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, HorizonMessage(tc.pool)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// spec.tokens.defaultMaxTokens defaults to the dispatchers' own default
// when spec.tokens is given, without writing through the caller's
// pointer; absent spec.tokens stays absent, so a pool that sets nothing
// puts no tokens in its policy.
func TestApplyDefaultsTokens(t *testing.T) {
	given := &v1alpha1.Tokens{}
	spec := v1alpha1.ModelPoolSpec{Tokens: given}
	ApplyDefaults(&spec)
	if diff := cmp.Diff(&v1alpha1.Tokens{DefaultMaxTokens: policy.DefaultMaxTokens, BoundBy: v1alpha1.BoundByRequests}, spec.Tokens); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}
	if given.DefaultMaxTokens != 0 || given.BoundBy != "" {
		t.Errorf("ApplyDefaults wrote %d through the caller's Tokens", given.DefaultMaxTokens)
	}
	set := v1alpha1.ModelPoolSpec{Tokens: &v1alpha1.Tokens{DefaultMaxTokens: 7}}
	ApplyDefaults(&set)
	if set.Tokens.DefaultMaxTokens != 7 {
		t.Errorf("a set defaultMaxTokens became %d", set.Tokens.DefaultMaxTokens)
	}
	var absent v1alpha1.ModelPoolSpec
	ApplyDefaults(&absent)
	if absent.Tokens != nil {
		t.Errorf("absent tokens became %+v", absent.Tokens)
	}
}
