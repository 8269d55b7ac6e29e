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

// withTokenBounds bounds the seed pool by tokens at prefill and decode
// tokens per slot-second (0 leaves them unset).
func withTokenBounds(prefill, decode int32) func(*v1alpha1.ModelPool) {
	return func(p *v1alpha1.ModelPool) {
		p.Spec.Tokens = &v1alpha1.Tokens{DefaultMaxTokens: 1024, BoundBy: v1alpha1.BoundByTokens,
			PrefillTokensPerSecond: prefill, DecodeTokensPerSecond: decode}
	}
}

func withWeights(mode v1alpha1.FairnessMode, in, out int32) func(*v1alpha1.ModelPool) {
	return func(p *v1alpha1.ModelPool) {
		p.Spec.Fairness = &v1alpha1.Fairness{Mode: mode, InputWeight: in, OutputWeight: out}
	}
}

func measured(p *v1alpha1.ModelPool) { p.Spec.ServiceTime.Source = v1alpha1.ServiceTimeMeasured }

// tokenRow is a tier's bounds in requests and in tokens.
type tokenRow struct {
	Name                     string
	Bound                    int32
	TokenBound, TenantTokens int64
}

type tokenPoolRow struct {
	Rate             string
	Source           v1alpha1.ServiceTimeSource
	TokenServiceRate float64
}

// The seed (C=4, S=6s, tiers of 5s, 20s and 60s with shares 0.25, 0.10
// and 0.04) at 2000 prompt and 50 output tokens per slot-second, weights
// 1 and 2: r = 3 × 2000 × 50 / 2050 = 146.341..., so 24 slots serve
// 3512.195... weighted tokens a second and premium's 5s hold 17560.
func TestComputeBoundsInTokens(t *testing.T) {
	declared := tokenPoolRow{"146.341", v1alpha1.ServiceTimeDeclared, 24 * 300000.0 / 2050}
	tests := map[string]struct {
		pool     *v1alpha1.ModelPool
		replicas int32
		observed float64
		wantPool tokenPoolRow
		want     []tokenRow
	}{
		"declared, balanced reference request": {pool: seed.Pool(withTokenBounds(2000, 50)), replicas: 6, wantPool: declared,
			want: []tokenRow{{"premium", 20, 17560, 4390}, {"standard", 80, 70243, 7024}, {"free", 240, 210731, 8429}}},
		"the client timeout caps the wait in tokens as in requests": {pool: seed.Pool(withTokenBounds(2000, 50), seed.WithClientTimeout(30*time.Second)),
			replicas: 6, wantPool: declared,
			want: []tokenRow{{"premium", 20, 17560, 4390}, {"standard", 80, 70243, 7024}, {"free", 120, 105365, 4214}}},
		// r = 10 × 2000 × 50 / 2050 = 487.8...
		"the weights price the reference request": {pool: seed.Pool(withTokenBounds(2000, 50), withWeights(v1alpha1.FairnessRequests, 3, 7)), replicas: 6,
			wantPool: tokenPoolRow{"487.805", v1alpha1.ServiceTimeDeclared, 24 * 1000000.0 / 2050},
			want:     []tokenRow{{"premium", 20, 58536, 14634}, {"standard", 80, 234146, 23414}, {"free", 240, 702439, 28097}}},
		"boundBy Requests: no token bounds, rates or not": {pool: seed.Pool(withTokenBounds(2000, 50), func(p *v1alpha1.ModelPool) {
			p.Spec.Tokens.BoundBy = v1alpha1.BoundByRequests
		}), replicas: 6, want: []tokenRow{{"premium", 20, 0, 0}, {"standard", 80, 0, 0}, {"free", 240, 0, 0}}},
		"no spec.tokens: none": {pool: seed.Pool(), replicas: 6, observed: 500,
			want: []tokenRow{{"premium", 20, 0, 0}, {"standard", 80, 0, 0}, {"free", 240, 0, 0}}},
		"Measured follows the measured rate": {pool: seed.Pool(withTokenBounds(2000, 50), measured), replicas: 6, observed: 500.5,
			wantPool: tokenPoolRow{"500.5", v1alpha1.ServiceTimeMeasured, 24 * 500.5},
			want:     []tokenRow{{"premium", 20, 60060, 15015}, {"standard", 80, 240240, 24024}, {"free", 240, 720720, 28828}}},
		"Measured starts from the declared rate": {pool: seed.Pool(withTokenBounds(2000, 50), measured), replicas: 6, wantPool: declared,
			want: []tokenRow{{"premium", 20, 17560, 4390}, {"standard", 80, 70243, 7024}, {"free", 240, 210731, 8429}}},
		"Declared ignores a measured rate": {pool: seed.Pool(withTokenBounds(2000, 50)), replicas: 6, observed: 500.5, wantPool: declared,
			want: []tokenRow{{"premium", 20, 17560, 4390}, {"standard", 80, 70243, 7024}, {"free", 240, 210731, 8429}}},
		"Measured without a declared rate: by requests until measured": {pool: seed.Pool(withTokenBounds(0, 0), measured), replicas: 6,
			want: []tokenRow{{"premium", 20, 0, 0}, {"standard", 80, 0, 0}, {"free", 240, 0, 0}}},
		"Measured without a declared rate, measured": {pool: seed.Pool(withTokenBounds(0, 0), measured), replicas: 6, observed: 100,
			wantPool: tokenPoolRow{"100", v1alpha1.ServiceTimeMeasured, 2400},
			want:     []tokenRow{{"premium", 20, 12000, 3000}, {"standard", 80, 48000, 4800}, {"free", 240, 144000, 5760}}},
		// 0.7 read as its decimal: 24 × 0.7 × 5 = 84, not the 83 of the
		// binary value below 0.7.
		"a measured rate is read exactly": {pool: seed.Pool(withTokenBounds(0, 0), measured), replicas: 6, observed: 0.7,
			wantPool: tokenPoolRow{"0.7", v1alpha1.ServiceTimeMeasured, 24 * 0.7},
			want:     []tokenRow{{"premium", 20, 84, 21}, {"standard", 80, 336, 33}, {"free", 240, 1008, 40}}},
		"at least 1, tenants too": {pool: seed.Pool(withTokenBounds(0, 0), measured), replicas: 6, observed: 0.001,
			wantPool: tokenPoolRow{"0.001", v1alpha1.ServiceTimeMeasured, 0.024},
			want:     []tokenRow{{"premium", 20, 1, 1}, {"standard", 80, 1, 1}, {"free", 240, 1, 1}}},
		"zero replicas without a cold start: 0, as the request bound": {pool: seed.Pool(withTokenBounds(2000, 50)), replicas: 0,
			wantPool: tokenPoolRow{"146.341", v1alpha1.ServiceTimeDeclared, 0},
			want:     []tokenRow{{"premium", 0, 0, 0}, {"standard", 0, 0, 0}, {"free", 0, 0, 0}}},
		// C = 4 slots after 10s: standard's 20s leave 10s, 4 × r × 10 =
		// 5853; premium cannot wait out the cold start, 0 in both.
		"held for a cold start: the first replica's tokens after it": {pool: seed.Pool(withTokenBounds(2000, 50), seed.WithColdStart(10*time.Second)),
			replicas: 0, wantPool: tokenPoolRow{"146.341", v1alpha1.ServiceTimeDeclared, 4 * 300000.0 / 2050},
			want: []tokenRow{{"premium", 0, 0, 0}, {"standard", 6, 5853, 585}, {"free", 33, 29268, 1170}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: tc.pool, ReadyReplicas: tc.replicas, Tiers: seed.Tiers(), Dispatchers: 1,
				ObservedTokenRate: tc.observed, Backends: []policy.Backend{{Address: "10.0.0.7:8000"}}})
			if err != nil {
				t.Fatal(err)
			}
			var rows []tokenRow
			for _, tb := range got.Tiers {
				rows = append(rows, tokenRow{tb.Name, tb.QueueBound, tb.QueueTokenBound, tb.TenantQueueTokenLimit})
			}
			if diff := cmp.Diff(tc.want, rows); diff != "" {
				t.Errorf("tiers (-want +got):\n%s", diff)
			}
			p := got.Pool
			gotPool := tokenPoolRow{p.TokenRateString, p.TokenRateSource, p.TokenServiceRate}
			if diff := cmp.Diff(tc.wantPool, gotPool, cmp.Comparer(closeFloat)); diff != "" {
				t.Errorf("pool (-want +got):\n%s", diff)
			}
			pol := got.PolicyFor(0)
			if !closeFloat(pol.TokenServiceRate, tc.wantPool.TokenServiceRate) {
				t.Errorf("policy tokenServiceRate %v, want %v", pol.TokenServiceRate, tc.wantPool.TokenServiceRate)
			}
			for i, pt := range pol.Tiers {
				if pt.QueueTokenBound != rows[i].TokenBound || pt.TenantQueueTokenLimit != rows[i].TenantTokens {
					t.Errorf("policy tier %s: %d/%d, want the pool's %d/%d (one dispatcher)", pt.Name, pt.QueueTokenBound, pt.TenantQueueTokenLimit, rows[i].TokenBound, rows[i].TenantTokens)
				}
			}
			if err := servable(pol, p).Validate(); err != nil {
				t.Errorf("policy invalid: %v", err)
			}
		})
	}
}

// servable is pol as the controller pushes it: no backends while the pool
// has no slot.
func servable(pol policy.Policy, p PoolBounds) *policy.Policy {
	if p.Concurrency == 0 {
		pol.Slots, pol.Backends = 0, nil
	}
	return &pol
}

func closeFloat(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// Past 2⁵³ − 1 a token bound saturates: r = 2000 × 10⁷ × 10⁷ / (2 × 10⁷)
// = 10¹⁰ per slot-second over 10⁶ slots and a day is about 8.6 × 10²⁰.
func TestTokenBoundsSaturate(t *testing.T) {
	pool := seed.Pool(withTokenBounds(v1alpha1.MaxTokensPerSecond, v1alpha1.MaxTokensPerSecond), withWeights(v1alpha1.FairnessTokens, 1000, 1000),
		func(p *v1alpha1.ModelPool) { p.Spec.ConcurrencyPerReplica = 1000 })
	tiers := []v1alpha1.ServiceTier{seed.Tier("bulk", 0, 24*time.Hour, "0.5")}
	got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: 1000, Tiers: tiers, Dispatchers: 2})
	if err != nil {
		t.Fatal(err)
	}
	tb := got.Tiers[0]
	want := tokenRow{"bulk", tb.QueueBound, MaxQueueTokenBound, MaxQueueTokenBound / 2}
	if diff := cmp.Diff(want, tokenRow{tb.Name, tb.QueueBound, tb.QueueTokenBound, tb.TenantQueueTokenLimit}); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got.Pool.TokenRateString != "10000000000" {
		t.Errorf("rate %s, want 10000000000", got.Pool.TokenRateString)
	}
	// Local mode halves the saturated bound for each of the two.
	if b := got.PolicyFor(1).Tiers[0].QueueTokenBound; b != MaxQueueTokenBound/2 {
		t.Errorf("dispatcher 1's bound %d, want %d", b, int64(MaxQueueTokenBound/2))
	}
}

// Token bounds split over the dispatchers as the request bounds do: each
// its slot fraction in Local mode, at least 1; the pool's in Redis mode;
// while held, nothing for a dispatcher without a share of the first
// replica. tokenServiceRate is each one's slots × r.
func TestTokenBoundsSplit(t *testing.T) {
	type row struct {
		Slots                 int
		Bounds, TenantLimits  []int64 // premium, standard, free
		TokenRate, RequestsPS float64
	}
	r := 300000.0 / 2050
	tests := map[string]struct {
		pool        *v1alpha1.ModelPool
		replicas    int32
		dispatchers int
		want        []row
	}{
		"Local, two": {pool: seed.Pool(withTokenBounds(2000, 50)), replicas: 6, dispatchers: 2, want: []row{
			{12, []int64{8780, 35121, 105365}, []int64{2195, 3512, 4214}, 12 * r, 2},
			{12, []int64{8780, 35121, 105365}, []int64{2195, 3512, 4214}, 12 * r, 2},
		}},
		// 24 slots over 5: 5, 5, 5, 5, 4.
		"Local, uneven": {pool: seed.Pool(withTokenBounds(2000, 50)), replicas: 6, dispatchers: 5, want: []row{
			{5, []int64{3658, 14633, 43902}, []int64{914, 1463, 1756}, 5 * r, 5.0 / 6},
			{5, []int64{3658, 14633, 43902}, []int64{914, 1463, 1756}, 5 * r, 5.0 / 6},
			{5, []int64{3658, 14633, 43902}, []int64{914, 1463, 1756}, 5 * r, 5.0 / 6},
			{5, []int64{3658, 14633, 43902}, []int64{914, 1463, 1756}, 5 * r, 5.0 / 6},
			{4, []int64{2926, 11707, 35121}, []int64{731, 1170, 1404}, 4 * r, 4.0 / 6},
		}},
		// The Gate counts queued requests, not tokens: each dispatcher
		// enforces its slice of the token bounds, drained at its slice of
		// the rate; slots and request rates stay the pool's.
		"Redis, two: token bounds split, the rest the pool's": {pool: seed.Pool(withTokenBounds(2000, 50), func(p *v1alpha1.ModelPool) { p.Spec.SharedState = v1alpha1.SharedStateRedis }),
			replicas: 6, dispatchers: 2, want: []row{
				{24, []int64{8780, 35121, 105365}, []int64{2195, 3512, 4214}, 12 * r, 4},
				{24, []int64{8780, 35121, 105365}, []int64{2195, 3512, 4214}, 12 * r, 4},
			}},
		// C = 4 over 5 while held: the fifth holds nothing.
		"held, Local, one without a share": {pool: seed.Pool(withTokenBounds(2000, 50), seed.WithColdStart(10*time.Second)),
			replicas: 0, dispatchers: 5, want: []row{
				{0, []int64{0, 1463, 7317}, []int64{0, 146, 292}, r, 1.0 / 6},
				{0, []int64{0, 1463, 7317}, []int64{0, 146, 292}, r, 1.0 / 6},
				{0, []int64{0, 1463, 7317}, []int64{0, 146, 292}, r, 1.0 / 6},
				{0, []int64{0, 1463, 7317}, []int64{0, 146, 292}, r, 1.0 / 6},
				{0, []int64{0, 0, 0}, []int64{0, 0, 0}, 0, 0},
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: tc.pool, ReadyReplicas: tc.replicas, Tiers: seed.Tiers(), Dispatchers: tc.dispatchers,
				Backends: []policy.Backend{{Address: "10.0.0.7:8000"}}})
			if err != nil {
				t.Fatal(err)
			}
			var rows []row
			for _, pol := range got.Policies {
				rw := row{Slots: pol.Slots, TokenRate: pol.TokenServiceRate, RequestsPS: pol.ServiceRate}
				for _, pt := range pol.Tiers {
					rw.Bounds = append(rw.Bounds, pt.QueueTokenBound)
					rw.TenantLimits = append(rw.TenantLimits, pt.TenantQueueTokenLimit)
				}
				rows = append(rows, rw)
				if err := servable(pol, got.Pool).Validate(); err != nil {
					t.Errorf("policy invalid: %v", err)
				}
			}
			if diff := cmp.Diff(tc.want, rows, cmp.Comparer(closeFloat)); diff != "" {
				t.Errorf("policies (-want +got):\n%s", diff)
			}
		})
	}
}

// spec.fairness and the tenants' weights reach the policy only when they
// change something: absent, or mode Requests with weights 1 and 2, and
// weight 1, keep the policy of revision 2, field for field.
func TestFairnessInThePolicy(t *testing.T) {
	quotas := func(weights ...int32) []v1alpha1.TenantQuota {
		var out []v1alpha1.TenantQuota
		for i, w := range weights {
			q := seed.Quota(string(rune('a'+i)), string(rune('a'+i)), "premium", nil)
			q.Spec.Weight = w
			out = append(out, q)
		}
		return out
	}
	tests := map[string]struct {
		pool         *v1alpha1.ModelPool
		weights      []int32
		wantFairness *policy.Fairness
		wantWeights  []int
	}{
		"absent":                       {pool: seed.Pool(), weights: []int32{0, 1}, wantWeights: []int{0, 0}},
		"the defaults, spelled out":    {pool: seed.Pool(withWeights(v1alpha1.FairnessRequests, 1, 2)), weights: []int32{1}, wantWeights: []int{0}},
		"defaulted by capacity":        {pool: seed.Pool(withWeights("", 0, 0)), wantWeights: nil},
		"Tokens mode":                  {pool: seed.Pool(withWeights(v1alpha1.FairnessTokens, 1, 2)), weights: []int32{3, 1}, wantFairness: &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2}, wantWeights: []int{3, 0}},
		"Requests with other weights":  {pool: seed.Pool(withWeights(v1alpha1.FairnessRequests, 1, 4)), wantFairness: &policy.Fairness{Mode: policy.FairnessRequests, InputWeight: 1, OutputWeight: 4}},
		"Tokens, weights by defaults":  {pool: seed.Pool(withWeights(v1alpha1.FairnessTokens, 0, 0)), wantFairness: &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2}},
		"weights at the schema's most": {pool: seed.Pool(), weights: []int32{1000}, wantWeights: []int{1000}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ComputeBounds(BoundsInput{Pool: tc.pool, ReadyReplicas: 6, Tiers: seed.Tiers(), Quotas: quotas(tc.weights...), Dispatchers: 2})
			if err != nil {
				t.Fatal(err)
			}
			for i, pol := range got.Policies {
				if diff := cmp.Diff(tc.wantFairness, pol.Fairness); diff != "" {
					t.Errorf("dispatcher %d fairness (-want +got):\n%s", i, diff)
				}
				var weights []int
				for _, tn := range pol.Tenants {
					weights = append(weights, tn.Weight)
				}
				if diff := cmp.Diff(tc.wantWeights, weights); diff != "" {
					t.Errorf("dispatcher %d weights (-want +got):\n%s", i, diff)
				}
				if _, dropped := pol.At(2); (tc.wantFairness == nil && !hasWeight(tc.wantWeights)) != (len(dropped) == 0) {
					t.Errorf("dispatcher %d: revision 2 drops %v", i, dropped)
				}
			}
			if got.Policies[0].Fairness != nil && got.Policies[0].Fairness == got.Policies[1].Fairness {
				t.Error("two policies share one Fairness")
			}
			for i, tb := range got.Tenants { // quotas a, b, ... in order
				if want := max(1, tc.weights[i]); tb.Weight != want {
					t.Errorf("quota %s: weight %d, want %d", tb.QuotaName, tb.Weight, want)
				}
			}
		})
	}
}

func hasWeight(ws []int) bool {
	for _, w := range ws {
		if w != 0 {
			return true
		}
	}
	return false
}

// What the schema refuses, capacity refuses too, for objects that did not
// pass through an API server.
func TestComputeBoundsRefusesBadTokenFields(t *testing.T) {
	q := seed.Quota("q", "acme", "premium", nil)
	q.Spec.Weight = 1001
	got, err := ComputeBounds(BoundsInput{Pool: seed.Pool(withTokenBounds(-1, v1alpha1.MaxTokensPerSecond+1), withWeights("Bytes", 0, 1001),
		func(p *v1alpha1.ModelPool) { p.Spec.Tokens.BoundBy = "Bytes" }), ReadyReplicas: 1, Tiers: seed.Tiers(), Quotas: []v1alpha1.TenantQuota{q}})
	want := "invalid bounds input: spec.tokens.prefillTokensPerSecond: -1 must be between 1 and 10000000; " +
		"spec.tokens.decodeTokensPerSecond: 10000001 must be between 1 and 10000000; spec.tokens.boundBy: \"Bytes\" must be Requests or Tokens; " +
		"spec.fairness.outputWeight: 1001 must be between 1 and 1000; spec.fairness.mode: \"Bytes\" must be Requests or Tokens; " +
		"quota \"q\": spec.weight 1001 must be between 1 and 1000"
	if !errors.Is(err, ErrInvalidInput) || err.Error() != want {
		t.Fatalf("got %+v, %v\nwant %q", got.Pool, err, want)
	}
}
