package simulate

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestSlotTokenRate(t *testing.T) {
	tests := map[string]struct {
		in, out         int
		prefill, decode float64
		want            float64
	}{
		// 3 / (1/1000 + 1/50) = 3 / 0.021.
		"default weights": {in: 1, out: 2, prefill: 1000, decode: 50, want: 3 / 0.021},
		// Weights in the ratio of the rates: every token costs its time.
		"weights as the rates": {in: 1, out: 20, prefill: 1000, decode: 50, want: 1000},
		"equal rates":          {in: 1, out: 1, prefill: 100, decode: 100, want: 100},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := slotTokenRate(policy.Fairness{InputWeight: tc.in, OutputWeight: tc.out}, tc.prefill, tc.decode)
			if d := got - tc.want; d > 1e-9 || d < -1e-9 {
				t.Errorf("slotTokenRate = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestQueueTokenBound(t *testing.T) {
	tests := map[string]struct {
		slots      int
		rate       float64
		w, timeout time.Duration
		want       int64
		share      float64
		wantTenant int64
	}{
		// floor(8 × 1000/7 × 30) = floor(34285.71).
		"W without a client timeout": {slots: 8, rate: 1000.0 / 7, w: 30 * time.Second, want: 34285, share: 0.5, wantTenant: 17142},
		// min(W, clientTimeout) = 20 s: floor(22857.14).
		"the client timeout is shorter": {slots: 8, rate: 1000.0 / 7, w: 30 * time.Second, timeout: 20 * time.Second, want: 22857, share: 1, wantTenant: 22857},
		"the client timeout is longer":  {slots: 2, rate: 100, w: 10 * time.Second, timeout: time.Minute, want: 2000, share: 0.29, wantTenant: 580},
		// 0.29 × 100 is 28.999… in floats: still 29.
		"a share that floats below": {slots: 1, rate: 10, w: 10 * time.Second, want: 100, share: 0.29, wantTenant: 29},
		"at least one token":        {slots: 1, rate: 0.001, w: time.Second, want: 1, share: 0.5, wantTenant: 1},
		"no slots, no token bound":  {slots: 0, rate: 100, w: 10 * time.Second, want: 0, share: 1, wantTenant: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := queueTokenBound(tc.slots, tc.rate, tc.w, tc.timeout)
			if got != tc.want {
				t.Errorf("queueTokenBound = %d, want %d", got, tc.want)
			}
			if tn := tenantTokenLimit(got, tc.share); tn != tc.wantTenant {
				t.Errorf("tenantTokenLimit(%d, %g) = %d, want %d", got, tc.share, tn, tc.wantTenant)
			}
		})
	}
}

// TestTokenBoundsPolicy: vtc-tokenbound's policy of 4 slots, rates 1000
// and 50 with the default weights (r = 3/0.021 per slot), tier t W 10 s
// and share 1: the bound floor(4 × r × 10) = 5714, the token drain rate
// 4r, Tokens fairness; the request bounds are left as they were.
func TestTokenBoundsPolicy(t *testing.T) {
	env := &schedEnv{tokens: &TokenModel{PrefillTokensPerSecond: 1000, DecodeTokensPerSecond: 50},
		tiers: []tierSpec{{name: "t", share: 1}}, index: map[string]int{"t": 0}}
	p := policy.Policy{Slots: 4, Tiers: []policy.Tier{{Name: "t", TolerableWaitSeconds: 10, QueueBound: 4, TenantQueueLimit: 4}}}
	kinds[SchedVTCTokenBound].shape(&p, env)
	want := policy.Policy{
		Slots:            4,
		Fairness:         &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2},
		TokenServiceRate: 4 * 3 / 0.021,
		Tiers:            []policy.Tier{{Name: "t", TolerableWaitSeconds: 10, QueueBound: 4, TenantQueueLimit: 4, QueueTokenBound: 5714, TenantQueueTokenLimit: 5714}},
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	// vtc changes the order only.
	q := policy.Policy{Slots: 4, Fairness: &policy.Fairness{OutputWeight: 5}, Tiers: []policy.Tier{{Name: "t", QueueBound: 4}}}
	kinds[SchedVTC].shape(&q, env)
	wantQ := policy.Policy{Slots: 4, Fairness: &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 5}, Tiers: []policy.Tier{{Name: "t", QueueBound: 4}}}
	if diff := cmp.Diff(wantQ, q); diff != "" {
		t.Errorf("vtc policy (-want +got):\n%s", diff)
	}
}

// tokenLoad is a Load on exactPool without a service-time distribution:
// spec.tokens sets it.
func tokenLoad(tokens string, tenants ...string) string {
	return `apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 1
  duration: 40s
  tokens: ` + tokens + `
  tenants:
  - ` + strings.Join(tenants, "\n  - ") + "\n"
}

// TestServiceTimeFromTokens: one slot, prefill 100 and decode 10 tokens
// a second. a (100 prompt, 10 output) holds the slot 1 + 1 = 2 s from 0;
// b (300 prompt, 20 output) arrives with it, waits 2 s and holds it 3 + 2
// = 5 s: 7 busy seconds of 40. Weighted (1, 2): a 120, b 340; Jain's
// index (460)² / (2 × (120² + 340²)) = 211600 / 260000; b's share 340/460.
// With weights (2, 5): a 250, b 700, 950² / (2 × (250² + 700²)).
func TestServiceTimeFromTokens(t *testing.T) {
	a := "{tenant: a, arrival: {process: burst, at: 0s, count: 1}, promptTokens: {distribution: constant, mean: 100}, outputTokens: {distribution: constant, mean: 10}, maxTokens: 10}"
	b := "{tenant: b, arrival: {process: burst, at: 0s, count: 1}, promptTokens: {distribution: constant, mean: 300}, outputTokens: {distribution: constant, mean: 20}, maxTokens: 20}"
	type figures struct {
		Util, JainTokens, ShareA, ShareB, WaitB float64
		Tokens                                  TokenCounts
	}
	tests := map[string]struct {
		weights string
		want    figures
	}{
		"default weights": {want: figures{Util: 0.175, JainTokens: round6(211600.0 / 260000), ShareA: round6(120.0 / 460), ShareB: round6(340.0 / 460), WaitB: 2,
			Tokens: TokenCounts{Prompt: 400, Completion: 30}}},
		"the Load's weights": {weights: ", inputWeight: 2, outputWeight: 5", want: figures{Util: 0.175, JainTokens: round6(902500.0 / 1105000), ShareA: round6(250.0 / 950), ShareB: round6(700.0 / 950), WaitB: 2,
			Tokens: TokenCounts{Prompt: 400, Completion: 30}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in, err := Read(src("tokens.yaml", exactPool(1, "100s")+tokenLoad("{prefillTokensPerSecond: 100, decodeTokensPerSecond: 10"+tc.weights+"}", a, b)))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(in, Options{Compare: []string{SchedVTC, SchedVTCTokenBound}, checkInvariants: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, sched := range res.Schedulers() {
				r := res.Of(sched)
				tr := r.Tiers["t"]
				got := figures{Util: r.Utilisation, JainTokens: tr.JainTokens, ShareA: r.Tenants["a"].TokenShare, ShareB: r.Tenants["b"].TokenShare,
					WaitB: r.Tenants["b"].Wait.Max, Tokens: tr.TokensServed}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", sched, diff)
				}
			}
			want := "the Load's mean service time 3.5s (from its tokens and spec.tokens' rates) differs from the pool's 10s (Declared): the request bounds assume the pool's"
			if !containsString(res.Warnings, want) {
				t.Errorf("warnings %q lack %q", res.Warnings, want)
			}
		})
	}
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestJainTokensByWeight: jainTokens divides each tenant's weighted tokens
// by its weight. b, of weight 3, served three times a's tokens: both got
// their due, 1; a tier whose one tenant served nothing has 0.
func TestJainTokensByWeight(t *testing.T) {
	tiers := map[string]*tierState{"t": {name: "t", res: &TierResult{}}, "u": {name: "u", res: &TierResult{}}}
	ten := func(name, tier string, prompt, completion int64) *tenantState {
		res := &TenantResult{Tier: tier}
		res.TokensServed = TokenCounts{Prompt: prompt, Completion: completion}
		return &tenantState{name: name, tier: tiers[tier], res: res}
	}
	e := &engine{
		res:         &Result{Tiers: map[string]*TierResult{"t": tiers["t"].res, "u": tiers["u"].res}},
		tenants:     []*tenantState{ten("a", "t", 100, 50), ten("b", "t", 300, 150), ten("c", "u", 0, 0)},
		policyState: policyState{fair: policy.Fairness{InputWeight: 1, OutputWeight: 2}, weight: map[string]int{"b": 3}},
	}
	e.finishTokens()
	got := map[string]float64{"jain t": e.res.Tiers["t"].JainTokens, "jain u": e.res.Tiers["u"].JainTokens,
		"share a": e.tenants[0].res.TokenShare, "share b": e.tenants[1].res.TokenShare, "share c": e.tenants[2].res.TokenShare}
	want := map[string]float64{"jain t": 1, "jain u": 0, "share a": 0.25, "share b": 0.75, "share c": 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Unweighted, the same tokens: (200 + 600)² / (2 × (200² + 600²)) = 0.8.
	e.weight = nil
	e.finishTokens()
	if got := e.res.Tiers["t"].JainTokens; got != 0.8 {
		t.Errorf("jainTokens with weights 1 = %v, want 0.8", got)
	}
}

func TestTokenModelInputErrors(t *testing.T) {
	withTokens := func(tokens, tenantExtra string) Source { return src("load.yaml", withTokensDoc(tokens, tenantExtra)) }
	const load = `load.yaml: document 1 (Load): invalid: spec.`
	const prompt = "\n    promptTokens: {distribution: constant, mean: 10}"
	tests := map[string]struct {
		src     Source
		wantErr error
		wantMsg string
	}{
		"zero and negative rates": {
			src: withTokens("{prefillTokensPerSecond: 0, decodeTokensPerSecond: -1}", prompt), wantErr: ErrInvalid,
			wantMsg: load + `tokens.prefillTokensPerSecond: must be greater than 0 and at most 1e+09, got 0; spec.tokens.decodeTokensPerSecond: must be greater than 0 and at most 1e+09, got -1`,
		},
		"a rate left out": {
			src: withTokens("{prefillTokensPerSecond: 1000}", prompt), wantErr: ErrInvalid,
			wantMsg: load + `tokens.decodeTokensPerSecond: must be greater than 0 and at most 1e+09, got 0`,
		},
		"a rate above the maximum": {
			src: withTokens("{prefillTokensPerSecond: 2e9, decodeTokensPerSecond: 50}", prompt), wantErr: ErrInvalid,
			wantMsg: load + `tokens.prefillTokensPerSecond: must be greater than 0 and at most 1e+09, got 2e+09`,
		},
		"weights out of range": {
			src: withTokens("{prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50, inputWeight: -1, outputWeight: 1001}", prompt), wantErr: ErrInvalid,
			wantMsg: load + `tokens.inputWeight: must be from 1 to 1000 when set, got -1; spec.tokens.outputWeight: must be from 1 to 1000 when set, got 1001`,
		},
		"a tenant without tokens": {
			src: withTokens("{prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50}", ""), wantErr: ErrInvalid,
			wantMsg: load + `tenants[0]: needs promptTokens or outputTokens with spec.tokens: its requests would take no time`,
		},
		"a service-time distribution beside the rates": {
			src: src("load.yaml", strings.Replace(withTokensDoc("{prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50}", prompt), "  replicas: 1\n", "  replicas: 1\n  serviceTime: {distribution: constant, mean: 1s}\n", 1)), wantErr: ErrInvalid,
			wantMsg: load + `serviceTime: is not used with spec.tokens: a request's service time is then its prompt ÷ prefill + output ÷ decode`,
		},
		"unknown field": {
			src: withTokens("{prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50, boundBy: Tokens}", prompt), wantErr: ErrUnknownField,
			wantMsg: `load.yaml: document 1 (Load): unknown field "spec.tokens.boundBy"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Read(tc.src)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read() error = %v, want errors.Is %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

// withTokensDoc is loadDoc with spec.tokens and more fields for its
// tenant.
func withTokensDoc(tokens, tenantExtra string) string {
	doc := strings.Replace(loadDoc, "  replicas: 1\n", "  replicas: 1\n  tokens: "+tokens+"\n", 1)
	return strings.Replace(doc, "arrival: {process: poisson, rate: 1}", "arrival: {process: poisson, rate: 1}"+tenantExtra, 1)
}

// TestTokenBoundNeedsRates: vtc-tokenbound computes its bounds from the
// Load's token rates and refuses a Load without them; vtc does not need
// them.
func TestTokenBoundNeedsRates(t *testing.T) {
	in, err := Read(src("exact.yaml", exactPool(1, "100s")+exactLoad("", "{tenant: a, arrival: {process: burst, at: 0s, count: 1}}")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(in, Options{Compare: []string{SchedVTCTokenBound}})
	want := "--compare vtc-tokenbound: invalid: the Load has no spec.tokens, whose prefill and decode rates the token bounds are computed from"
	if !errors.Is(err, ErrInvalid) || err == nil || err.Error() != want {
		t.Errorf("Run() error = %v, want %q (ErrInvalid)", err, want)
	}
	if _, err := Run(in, Options{Compare: []string{SchedVTC}, checkInvariants: true}); err != nil {
		t.Errorf("vtc without token rates: %v", err)
	}
}

// TestTokensFairnessExact derives the order of both modes by hand. One
// slot (tenant cap 1), prefill 100 and decode 10 tokens a second, weights
// 1 and 2. At 0, a sends three requests of 1000 prompt and 10 output
// tokens (11 s, cost 1020 each) and b three of 100 and 10 (2 s, cost
// 120), interleaved a, b, a, b, a, b; a's first starts at once.
//
//   - tiergate (Requests): by age, b a b a b: a waits 0, 13, 26 s, b 11,
//     24, 37 s.
//   - vtc (Tokens): a is charged 1020 at its dispatch. b becomes
//     backlogged with nobody else backlogged: it is lifted to the counter
//     of the tenant served last, a's 1020. At 11 the counters tie and b's
//     head is older: b runs 11–13 (1140); at 13 a (1020) runs 13–24
//     (2040); then b twice, 24–28 (1260, 1380), and a 28–39. a waits 0,
//     13, 28 s, b 11, 24, 26 s: b, whose requests are small, is served
//     sooner.
//   - vtc-tokenbound with W 50 s: the bound is floor(1 × 3/0.11 × 50) =
//     1363. b (120), a (1020) and b (120) queue (1260); a's third (2280)
//     and b's third (1380) are refused. The order is vtc's: a waits 0,
//     13 s, b 11, 24 s.
func TestTokensFairnessExact(t *testing.T) {
	type tenantFigures struct {
		Served, RefusedCapacity int64
		WaitMean, WaitMax       float64
	}
	type want map[string]tenantFigures
	tests := map[string]struct {
		wait  string
		want  map[string]want
		bound int64
	}{
		"W 100 s: nothing refused": {wait: "100s", bound: 2727, want: map[string]want{
			SchedTiergate:      {"a": {Served: 3, WaitMean: 13, WaitMax: 26}, "b": {Served: 3, WaitMean: 24, WaitMax: 37}},
			SchedVTC:           {"a": {Served: 3, WaitMean: round6(41.0 / 3), WaitMax: 28}, "b": {Served: 3, WaitMean: round6(61.0 / 3), WaitMax: 26}},
			SchedVTCTokenBound: {"a": {Served: 3, WaitMean: round6(41.0 / 3), WaitMax: 28}, "b": {Served: 3, WaitMean: round6(61.0 / 3), WaitMax: 26}},
		}},
		"W 50 s: the token bound refuses": {wait: "50s", bound: 1363, want: map[string]want{
			SchedTiergate:      {"a": {Served: 3, WaitMean: 13, WaitMax: 26}, "b": {Served: 3, WaitMean: 24, WaitMax: 37}},
			SchedVTC:           {"a": {Served: 3, WaitMean: round6(41.0 / 3), WaitMax: 28}, "b": {Served: 3, WaitMean: round6(61.0 / 3), WaitMax: 26}},
			SchedVTCTokenBound: {"a": {Served: 2, RefusedCapacity: 1, WaitMean: 6.5, WaitMax: 13}, "b": {Served: 2, RefusedCapacity: 1, WaitMean: 17.5, WaitMax: 24}},
		}},
	}
	burst := func(name string, prompt int) string {
		return fmt.Sprintf("{tenant: %s, arrival: {process: burst, at: 0s, count: 3}, promptTokens: {distribution: constant, mean: %d}, outputTokens: {distribution: constant, mean: 10}, maxTokens: 10}", name, prompt)
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			load := strings.Replace(tokenLoad("{prefillTokensPerSecond: 100, decodeTokensPerSecond: 10}", burst("a", 1000), burst("b", 100)), "duration: 40s", "duration: 60s", 1)
			in, err := Read(src("fair.yaml", exactPool(1, tc.wait)+load))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(in, Options{Compare: Variants, checkInvariants: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, sched := range res.Schedulers() {
				got := want{}
				for _, tn := range []string{"a", "b"} {
					f := res.Of(sched).Tenants[tn]
					got[tn] = tenantFigures{Served: f.Served, RefusedCapacity: f.Refused.Capacity, WaitMean: f.Wait.Mean, WaitMax: f.Wait.Max}
				}
				if diff := cmp.Diff(tc.want[sched], got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", sched, diff)
				}
			}
			if got := res.Of(SchedVTCTokenBound).Tiers["t"].QueueTokenBound; got != tc.bound {
				t.Errorf("vtc-tokenbound's queueTokenBound = %d, want %d", got, tc.bound)
			}
			if got := res.Of(SchedVTC).Tiers["t"].QueueTokenBound; got != 0 {
				t.Errorf("vtc's queueTokenBound = %d, want 0 (bounded in requests)", got)
			}
		})
	}
}
