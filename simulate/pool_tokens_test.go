package simulate

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// TestVariantPools: vtc and vtc-tokenbound change a copy of the pool and
// nothing else: the fairness mode (keeping the weights), the boundBy, and
// the controller computes the rest. Pool of 4 slots, rates 1000 and 50,
// tier t with W 10 s and share 1, weights (1, 2): r = 3 × 1000 × 50 ÷
// 1050 = 1000/7, the bound floor(4 × r × 10) = 5714, the token drain rate
// 4r.
func TestVariantPools(t *testing.T) {
	const rates = "{prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50}"
	type got struct {
		Fairness                      *v1alpha1.Fairness
		BoundBy                       v1alpha1.QueueBoundBy
		PolicyFairness                *policy.Fairness
		TokenServiceRate              float64
		QueueTokenBound, TenantTokens int64
		QueueBound                    int
	}
	tokensOf := func(p *policy.Policy) *policy.Fairness { return p.Fairness }
	tests := map[string]struct {
		pool  string
		kind  string
		want  got
		wantR float64
	}{
		"vtc of a pool in Requests mode": {pool: tokenPool(4, "10s", rates, ""), kind: SchedVTC, want: got{
			Fairness: &v1alpha1.Fairness{Mode: v1alpha1.FairnessTokens, InputWeight: 1, OutputWeight: 2}, BoundBy: v1alpha1.BoundByRequests,
			PolicyFairness: &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2}, QueueBound: 4}},
		"vtc-tokenbound of a pool in Requests mode": {pool: tokenPool(4, "10s", rates, ""), kind: SchedVTCTokenBound, wantR: 1000.0 / 7, want: got{
			Fairness: &v1alpha1.Fairness{Mode: v1alpha1.FairnessTokens, InputWeight: 1, OutputWeight: 2}, BoundBy: v1alpha1.BoundByTokens,
			PolicyFairness:   &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2},
			TokenServiceRate: 4000.0 / 7, QueueTokenBound: 5714, TenantTokens: 5714, QueueBound: 4}},
		// The pool's own weights stay; vtc bounds in requests even when the
		// pool bounds in tokens. (2, 5): r = 7 × 1000 × 50 ÷ 1050 = 1000/3.
		"vtc of a pool with its weights, bounded in tokens": {
			pool: tokenPool(4, "10s", "{boundBy: Tokens, prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50}", "{inputWeight: 2, outputWeight: 5}"), kind: SchedVTC,
			want: got{Fairness: &v1alpha1.Fairness{Mode: v1alpha1.FairnessTokens, InputWeight: 2, OutputWeight: 5}, BoundBy: v1alpha1.BoundByRequests,
				PolicyFairness: &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 2, OutputWeight: 5}, QueueBound: 4}},
		"vtc-tokenbound of a pool with its weights": {
			pool: tokenPool(4, "10s", rates, "{mode: Requests, inputWeight: 2, outputWeight: 5}"), kind: SchedVTCTokenBound, wantR: 1000.0 / 3,
			want: got{Fairness: &v1alpha1.Fairness{Mode: v1alpha1.FairnessTokens, InputWeight: 2, OutputWeight: 5}, BoundBy: v1alpha1.BoundByTokens,
				PolicyFairness:   &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 2, OutputWeight: 5},
				TokenServiceRate: 4000.0 / 3, QueueTokenBound: 13333, TenantTokens: 13333, QueueBound: 4}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in, err := Read(src("p.yaml", tc.pool+tokenLoad("{tenant: a, arrival: {process: burst, at: 0s, count: 1}, promptTokens: {distribution: constant, mean: 10}}")))
			if err != nil {
				t.Fatal(err)
			}
			before := in.Pool.DeepCopy()
			v, err := variantInput(in, kinds[tc.kind].vary)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, in.Pool); diff != "" {
				t.Errorf("the input's pool changed (-before +after):\n%s", diff)
			}
			e := newEngine(v, Options{}, kinds[tc.kind])
			b, err := e.computeBounds(1, 1)
			if err != nil {
				t.Fatal(err)
			}
			p := b.PolicyFor(0)
			g := got{Fairness: v.Pool.Spec.Fairness, BoundBy: v.Pool.Spec.Tokens.BoundBy, PolicyFairness: tokensOf(&p), TokenServiceRate: p.TokenServiceRate,
				QueueTokenBound: p.Tiers[0].QueueTokenBound, TenantTokens: p.Tiers[0].TenantQueueTokenLimit, QueueBound: p.Tiers[0].QueueBound}
			if diff := cmp.Diff(tc.want, g, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if d := b.Pool.TokenRate - tc.wantR; d > 1e-9 || d < -1e-9 {
				t.Errorf("token rate %v, want %v", b.Pool.TokenRate, tc.wantR)
			}
		})
	}
}

// tokenPool is exactPool with spec.tokens and, when given, spec.fairness.
func tokenPool(concurrency int, wait, tokens, fairness string) string {
	extra := "  tokens: " + tokens + "\n"
	if fairness != "" {
		extra += "  fairness: " + fairness + "\n"
	}
	return strings.Replace(exactPool(concurrency, wait), "  defaultTier: t\n", "  defaultTier: t\n"+extra, 1)
}

// tokenLoad is a Load without a service-time distribution: the pool's
// token rates set it.
func tokenLoad(tenants ...string) string {
	return `apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 1
  duration: 40s
  tenants:
  - ` + strings.Join(tenants, "\n  - ") + "\n"
}

// TestServiceTimeFromTokens: one slot, prefill 100 and decode 10 tokens
// a second. a (100 prompt, 10 output) holds the slot 1 + 1 = 2 s from 0;
// b (300 prompt, 20 output) arrives with it, waits 2 s and holds it 3 + 2
// = 5 s: 7 busy seconds of 40. Weighted (1, 2): a 120, b 340; Jain's
// index (460)² / (2 × (120² + 340²)) = 211600 / 260000; b's share 340/460.
// With weights (2, 5): a 250, b 700, 950² / (2 × (250² + 700²)).
//
// Both answers are served (ReleaseServed), so the queue measures tokens
// per slot-second, a ratio of EWMAs of weight 0.1: tokens 120 then 120 +
// 0.1 × (340 − 120) = 142, slot time 2 s then 2.3 s: 142 ÷ 2.3; with
// (2, 5) (250 + 0.1 × 450) ÷ 2.3 = 295 ÷ 2.3.
func TestServiceTimeFromTokens(t *testing.T) {
	a := "{tenant: a, arrival: {process: burst, at: 0s, count: 1}, promptTokens: {distribution: constant, mean: 100}, outputTokens: {distribution: constant, mean: 10}, maxTokens: 10}"
	b := "{tenant: b, arrival: {process: burst, at: 0s, count: 1}, promptTokens: {distribution: constant, mean: 300}, outputTokens: {distribution: constant, mean: 20}, maxTokens: 20}"
	type figures struct {
		Util, JainTokens, ShareA, ShareB, WaitB, Measured float64
		Tokens                                            TokenCounts
	}
	tests := map[string]struct {
		fairness string
		want     figures
	}{
		"default weights": {want: figures{Util: 0.175, JainTokens: round6(211600.0 / 260000), ShareA: round6(120.0 / 460), ShareB: round6(340.0 / 460), WaitB: 2, Measured: round6(142 / 2.3),
			Tokens: TokenCounts{Prompt: 400, Completion: 30}}},
		"the pool's weights": {fairness: "{inputWeight: 2, outputWeight: 5}", want: figures{Util: 0.175, JainTokens: round6(902500.0 / 1105000), ShareA: round6(250.0 / 950), ShareB: round6(700.0 / 950), WaitB: 2, Measured: round6(295 / 2.3),
			Tokens: TokenCounts{Prompt: 400, Completion: 30}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in, err := Read(src("tokens.yaml", tokenPool(1, "100s", "{prefillTokensPerSecond: 100, decodeTokensPerSecond: 10}", tc.fairness)+tokenLoad(a, b)))
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
				got := figures{Util: r.Utilisation, Measured: r.MeasuredTokenRate, JainTokens: tr.JainTokens, ShareA: r.Tenants["a"].TokenShare, ShareB: r.Tenants["b"].TokenShare,
					WaitB: r.Tenants["b"].Wait.Max, Tokens: tr.TokensServed}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", sched, diff)
				}
			}
			want := "the Load's mean service time 3.5s (from its tokens and the pool's token rates) differs from the pool's 10s (Declared): the request bounds assume the pool's"
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

// TestTokenInputErrors: the pool's token fields are refused as the
// schema refuses them, with its messages; a Load that does not fit the
// pool's rates, and the Load's former spec.tokens, are refused too.
func TestTokenInputErrors(t *testing.T) {
	const rates = "{prefillTokensPerSecond: 1000, decodeTokensPerSecond: 50}"
	const prompt = "\n    promptTokens: {distribution: constant, mean: 10}"
	pool := func(tokens, fairness string) string {
		doc := poolDoc
		if tokens != "" {
			doc += "  tokens: " + tokens + "\n"
		}
		if fairness != "" {
			doc += "  fairness: " + fairness + "\n"
		}
		return doc
	}
	load := func(extra, tenantExtra string) string {
		doc := strings.Replace(loadDoc, "  replicas: 1\n", "  replicas: 1\n"+extra, 1)
		return strings.Replace(doc, "arrival: {process: poisson, rate: 1}", "arrival: {process: poisson, rate: 1}"+tenantExtra, 1)
	}
	docs := func(pool, load string) []Source {
		return []Source{src("pool.yaml", pool), src("tiers.yaml", tierDoc), src("load.yaml", load)}
	}
	const inPool = `pool.yaml: document 1 (ModelPool "llm"): invalid: `
	tests := map[string]struct {
		srcs    []Source
		wantErr error
		wantMsg string
	}{
		"rates of 0 and out of range": {
			srcs: docs(pool("{prefillTokensPerSecond: 0, decodeTokensPerSecond: 10000001}", ""), load("", prompt)), wantErr: ErrInvalid,
			wantMsg: inPool + "spec.tokens.prefillTokensPerSecond: must be from 1 to 10000000, got 0; spec.tokens.decodeTokensPerSecond: must be from 1 to 10000000, got 10000001",
		},
		"a negative rate": {
			srcs: docs(pool("{prefillTokensPerSecond: -5, decodeTokensPerSecond: 50}", ""), load("", prompt)), wantErr: ErrInvalid,
			wantMsg: inPool + "spec.tokens.prefillTokensPerSecond: must be from 1 to 10000000, got -5",
		},
		"one rate without the other": {
			srcs: docs(pool("{prefillTokensPerSecond: 1000}", ""), load("", prompt)), wantErr: ErrInvalid,
			wantMsg: inPool + "spec.tokens: tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond are set together or not at all",
		},
		"boundBy Tokens without rates": {
			srcs: docs(pool("{boundBy: Tokens}", ""), load("", prompt)), wantErr: ErrInvalid,
			wantMsg: inPool + "spec.tokens: tokens.boundBy Tokens needs tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond, unless serviceTime.source is Measured",
		},
		"an unknown boundBy": {
			srcs: docs(pool("{boundBy: Bytes}", ""), load("", prompt)), wantErr: ErrInvalid,
			wantMsg: inPool + `spec.tokens.boundBy: Unsupported value: "Bytes": supported values: "Requests", "Tokens"`,
		},
		"an unknown mode and weights out of range": {
			srcs: docs(pool("", "{mode: Fair, inputWeight: 0, outputWeight: 1001}"), load("", prompt)), wantErr: ErrInvalid,
			wantMsg: inPool + `spec.fairness.mode: Unsupported value: "Fair": supported values: "Requests", "Tokens"; spec.fairness.inputWeight: must be from 1 to 1000, got 0; spec.fairness.outputWeight: must be from 1 to 1000, got 1001`,
		},
		"a tenant weight of 0": {
			srcs: []Source{src("pool.yaml", pool(rates, "")), src("tiers.yaml", tierDoc),
				src("quota.yaml", "apiVersion: tiergate.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: a}\nspec: {tenant: a, tierRef: {name: free}, weight: 0}\n"), src("load.yaml", load("", prompt))},
			wantErr: ErrInvalid,
			wantMsg: `quota.yaml: document 1 (TenantQuota "a"): invalid: spec.weight: must be from 1 to 1000, got 0`,
		},
		"a tenant weight above 1000": {
			srcs: []Source{src("pool.yaml", pool(rates, "")), src("tiers.yaml", tierDoc),
				src("quota.yaml", "apiVersion: tiergate.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: a}\nspec: {tenant: a, tierRef: {name: free}, weight: 1001}\n"), src("load.yaml", load("", prompt))},
			wantErr: ErrInvalid,
			wantMsg: `quota.yaml: document 1 (TenantQuota "a"): invalid: spec.weight: must be from 1 to 1000, got 1001`,
		},
		"a tenant without tokens": {
			srcs: docs(pool(rates, ""), load("", "")), wantErr: ErrInvalid,
			wantMsg: "invalid: Load spec.tenants[0]: needs promptTokens or outputTokens when the pool declares spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond: its requests would take no time",
		},
		"a service-time distribution beside the rates": {
			srcs: docs(pool(rates, ""), load("  serviceTime: {distribution: constant, mean: 1s}\n", prompt)), wantErr: ErrInvalid,
			wantMsg: "invalid: Load spec.serviceTime: is not used when the pool declares spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond: a request's service time is then its prompt ÷ prefill + output ÷ decode",
		},
		"the Load's spec.tokens of before": {
			srcs: docs(pool(rates, ""), load("  tokens: "+rates+"\n", prompt)), wantErr: ErrUnknownField,
			wantMsg: `load.yaml: document 1 (Load): unknown field "spec.tokens"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Read(tc.srcs...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read() error = %v, want errors.Is %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMeasuredTokenBoundWarns: boundBy Tokens on a Measured pool without
// declared rates is legal, but the simulator has no measured rate: it
// says the tiers are bounded in requests, which they are.
func TestMeasuredTokenBoundWarns(t *testing.T) {
	pool := strings.Replace(exactPool(1, "100s"), "  serviceTime: {mean: 10s}\n", "  serviceTime: {mean: 10s, source: Measured}\n  tokens: {boundBy: Tokens}\n", 1)
	in, err := Read(src("m.yaml", pool+exactLoad("", "{tenant: a, arrival: {process: burst, at: 0s, count: 1}}")))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(in, Options{checkInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "spec.tokens.boundBy is Tokens without declared token rates: the controller would bound by the rate the dispatchers measure, which the simulator does not model; the tiers are bounded in requests"
	if !containsString(res.Warnings, want) {
		t.Errorf("warnings %q lack %q", res.Warnings, want)
	}
	if b := res.Tiers["t"].QueueTokenBound; b != 0 {
		t.Errorf("queueTokenBound %d, want 0", b)
	}
}

// TestTokenBoundNeedsRates: vtc-tokenbound computes its bounds from the
// pool's token rates and refuses a pool without them; vtc does not need
// them.
func TestTokenBoundNeedsRates(t *testing.T) {
	in, err := Read(src("exact.yaml", exactPool(1, "100s")+exactLoad("", "{tenant: a, arrival: {process: burst, at: 0s, count: 1}}")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(in, Options{Compare: []string{SchedVTCTokenBound}})
	want := "--compare vtc-tokenbound: invalid: the pool declares no spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond, from which the token bounds are computed"
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
			load := strings.Replace(tokenLoad(burst("a", 1000), burst("b", 100)), "duration: 40s", "duration: 60s", 1)
			in, err := Read(src("fair.yaml", tokenPool(1, tc.wait, "{prefillTokensPerSecond: 100, decodeTokensPerSecond: 10}", "")+load))
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
