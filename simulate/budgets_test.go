package simulate

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// budgetPool is one replica of 8 slots with a constant 1 s service time
// (μ = 8/s) and one tier "t" (tolerableWait 10 s: bound 80, tenant cap 8)
// whose tenantLimits are tierLimits ("" for none), plus quotas: what
// follows the pool in the file. Nothing queues in these scenarios, so
// every admitted request starts at once and ends 1 s later.
func budgetPool(tierLimits string, quotas ...string) string {
	if tierLimits != "" {
		tierLimits = "  tenantLimits: " + tierLimits + "\n"
	}
	doc := `apiVersion: tiergate.dev/v1alpha1
kind: ModelPool
metadata: {name: p}
spec:
  deploymentRef: {name: p}
  concurrencyPerReplica: 8
  serviceTime: {mean: 1s}
  backend: {port: 8000}
  dispatchers: {selector: {matchLabels: {app: d}}}
  defaultTier: t
---
apiVersion: tiergate.dev/v1alpha1
kind: ServiceTier
metadata: {name: t}
spec:
  poolRef: {name: p}
  basePriority: 0
  tolerableWait: 10s
  tenantShare: "1"
` + tierLimits
	for _, q := range quotas {
		doc += "---\n" + q
	}
	return doc + "---\n"
}

// budgetQuota is a TenantQuota of tenant in tier t with the given limits.
func budgetQuota(tenant, limits string) string {
	return fmt.Sprintf("apiVersion: tiergate.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: %s}\nspec: {tenant: %s, tierRef: {name: t}, limits: %s}\n", tenant, tenant, limits)
}

// budgetLoad is a Load of the given length, warm-up and extra spec lines
// with a constant 1 s service time.
func budgetLoad(duration, warmup, extra string, tenants ...string) string {
	return fmt.Sprintf(`apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 1
  duration: %s
  warmup: %s
  serviceTime: {distribution: constant, mean: 1s}
%s  tenants:
  - %s
`, duration, warmup, extra, strings.Join(tenants, "\n  - "))
}

// overTenant sends 100 tokens (50 prompt, 50 output, max_tokens 50) every
// 0.5 s: 12,000 a minute, twice its budget of 6,000.
const overTenant = `{tenant: over, arrival: {process: burst, at: 0s, count: 1, every: 500ms},
     promptTokens: {distribution: constant, mean: 50}, outputTokens: {distribution: constant, mean: 50}, maxTokens: 50}`

// underTenant sends the same requests every 2 s: 3,000 a minute, half its
// budget.
const underTenant = `{tenant: under, arrival: {process: burst, at: 0s, count: 1, every: 2s},
     promptTokens: {distribution: constant, mean: 50}, outputTokens: {distribution: constant, mean: 50}, maxTokens: 50}`

func runDoc(t *testing.T, doc string) *Result {
	t.Helper()
	in, err := Read(src("budgets.yaml", doc))
	if err != nil {
		t.Fatal(err)
	}
	return run(t, in)
}

// counts are the figures these tests derive by hand.
type counts struct {
	Offered, Retries, Admitted, Served int64
	Refused                            Refused
	Tokens                             TokenCounts
}

func countsOf(f *Figures) counts {
	return counts{Offered: f.Offered, Retries: f.Retries, Admitted: f.Admitted, Served: f.Served, Refused: f.Refused, Tokens: f.TokensServed}
}

// TestTokensBudgetServesItsBudget: a tenant with tokensPerMinute B = 6,000
// (100 a second) sending twice that is served B a minute, and one under
// its budget is served everything, derived request by request.
//
// over: its bucket starts full. Before its i-th arrival (t = i/2 s) it
// holds 6000 − 100i + 50i = 6000 − 50i, so arrivals 0..118 are admitted
// (the 118th takes it to 0); from then on it holds 50 before an odd
// arrival (refused: 429 rate_limited) and 100 before an even one
// (admitted): one request of 100 tokens a second, exactly its refill.
// The window is [120 s, 600 s): arrivals 240..1199, 960 offered; the even
// ones are admitted (480) and the odd refused (480); the served are those
// completing in the window, started at 119, 120, …, 598 s: 480, with 480 ×
// 50 prompt and completion tokens. 48,000 tokens in 8 minutes: 6,000 a
// minute, B.
//
// under: 50 tokens a second against a refill of 100: never refused.
// Arrivals at 120, 122, …, 598 s: 240 offered, admitted and served.
func TestTokensBudgetServesItsBudget(t *testing.T) {
	over := counts{Offered: 960, Admitted: 480, Served: 480, Refused: Refused{RateLimited: 480}, Tokens: TokenCounts{Prompt: 24000, Completion: 24000}}
	under := counts{Offered: 240, Admitted: 240, Served: 240, Tokens: TokenCounts{Prompt: 12000, Completion: 12000}}
	// over's budget is its quota's, under's the tier's tenantLimits.
	pool := budgetPool("{tokensPerMinute: 6000}", budgetQuota("over", "{tokensPerMinute: 6000}"))
	res := runDoc(t, pool+budgetLoad("10m", "2m", "", overTenant, underTenant))
	got := map[string]counts{"over": countsOf(&res.Tenants["over"].Figures), "under": countsOf(&res.Tenants["under"].Figures)}
	if diff := cmp.Diff(map[string]counts{"over": over, "under": under}, got); diff != "" {
		t.Errorf("tenants (-want +got):\n%s", diff)
	}
	if got, want := res.Tenants["over"].TokensServed.Total()*60/int64(res.MeasuredSeconds), int64(6000); got != want {
		t.Errorf("over was served %d tokens a minute, want its budget %d", got, want)
	}
	wantBudget := &policy.Limits{TokensPerMinute: 6000}
	for _, name := range []string{"over", "under"} {
		if diff := cmp.Diff(wantBudget, res.Tenants[name].Budget); diff != "" {
			t.Errorf("%s: budget (-want +got):\n%s", name, diff)
		}
	}
	tier := countsOf(&res.Tiers["t"].Figures)
	wantTier := counts{Offered: 1200, Admitted: 720, Served: 720, Refused: Refused{RateLimited: 480}, Tokens: TokenCounts{Prompt: 36000, Completion: 36000}}
	if diff := cmp.Diff(wantTier, tier); diff != "" {
		t.Errorf("tier (-want +got):\n%s", diff)
	}

	// Without budgets the same traffic is served whole.
	free := runDoc(t, budgetPool("")+budgetLoad("10m", "2m", "", overTenant))
	wantFree := counts{Offered: 960, Admitted: 960, Served: 960, Tokens: TokenCounts{Prompt: 48000, Completion: 48000}}
	if diff := cmp.Diff(wantFree, countsOf(&free.Tenants["over"].Figures)); diff != "" {
		t.Errorf("without a budget (-want +got):\n%s", diff)
	}
	if free.Tenants["over"].Budget != nil {
		t.Errorf("budget %+v without any", free.Tenants["over"].Budget)
	}
}

// TestTokensBudgetOverDispatchers: in Local mode two dispatchers hold
// 3,000 each. Round-robin sends over's even arrivals (t = 0, 1, 2, … s)
// to the first and its odd ones (t = 0.5, 1.5, …) to the second; each
// bucket holds 3000 − 50j before its j-th arrival, admits j <= 58, then
// every other one from j = 60: in the window 240 served each, 480 in
// all, as with one dispatcher. In Redis mode they are one exact bucket of
// 6,000: the one-dispatcher figures again.
func TestTokensBudgetOverDispatchers(t *testing.T) {
	want := counts{Offered: 960, Admitted: 480, Served: 480, Refused: Refused{RateLimited: 480}, Tokens: TokenCounts{Prompt: 24000, Completion: 24000}}
	for _, shared := range []string{"Local", "Redis"} {
		t.Run(shared, func(t *testing.T) {
			pool := strings.Replace(budgetPool("", budgetQuota("over", "{tokensPerMinute: 6000}")), "  defaultTier: t\n", "  defaultTier: t\n  sharedState: "+shared+"\n", 1)
			res := runDoc(t, pool+budgetLoad("10m", "2m", "  dispatchers: 2\n", overTenant))
			if diff := cmp.Diff(want, countsOf(&res.Tenants["over"].Figures)); diff != "" {
				t.Errorf("over (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBudgetExact checks the reservation, the settlement and the refusals
// against outcomes derived by hand, event by event.
func TestBudgetExact(t *testing.T) {
	tests := map[string]struct {
		doc  string
		want counts
		// slo, when set, is the tier's SLO attainment.
		slo float64
	}{
		// 600 tokens a minute (10 a second); bursts of 4 requests every 2 s
		// that reserve 150 (50 prompt + max_tokens 100) and use 70. At 0
		// all four fit (600 → 0). At 1 they complete: each settlement
		// gives back 80, so the bucket holds 0 + 10 + 320 = 330. At 2 it
		// holds 340: two fit (→ 40), two are refused. Were the
		// reservations kept, it would hold 20 and refuse all four.
		"settlement gives back what was not used": {
			doc: budgetPool("", budgetQuota("a", "{tokensPerMinute: 600}")) + budgetLoad("4s", "0s", "",
				`{tenant: a, arrival: {process: burst, at: 0s, count: 4, every: 2s},
     promptTokens: {distribution: constant, mean: 50}, outputTokens: {distribution: constant, mean: 20}, maxTokens: 100}`),
			want: counts{Offered: 8, Admitted: 6, Served: 6, Refused: Refused{RateLimited: 2}, Tokens: TokenCounts{Prompt: 300, Completion: 120}},
		},
		// 700 tokens a minute; a burst of 5 that reserve 150 each
		// (prompt only). Four fit (700 → 100); the fifth needs 50 more:
		// 50 × 60000 / 700 = 4285.7 ms, Retry-After 5 s (whole seconds,
		// rounded up). The retry at 5 s fits (100 + 58.3). Its wait from
		// its first attempt, 5 s, is over tolerableWait 4.5 s, so the SLO
		// is 4 of 5; a retry at 4.29 s would have met it.
		"a refused request retries after Retry-After in whole seconds": {
			doc: strings.Replace(budgetPool("", budgetQuota("a", "{tokensPerMinute: 700}")), "tolerableWait: 10s", "tolerableWait: 4500ms", 1) +
				budgetLoad("10s", "0s", "", `{tenant: a, arrival: {process: burst, at: 0s, count: 5}, retryOn429: true,
     promptTokens: {distribution: constant, mean: 150}}`),
			want: counts{Offered: 5, Retries: 1, Admitted: 5, Served: 5, Refused: Refused{RateLimited: 1}, Tokens: TokenCounts{Prompt: 750}},
			slo:  0.8,
		},
		// Each request reserves 150, more than the whole budget of 100:
		// x-should-retry: false, so the client does not retry it even
		// with retryOn429.
		"a reservation above the whole budget is never retried": {
			doc: budgetPool("{tokensPerMinute: 100}") + budgetLoad("10s", "0s", "", `{tenant: a, arrival: {process: burst, at: 0s, count: 3}, retryOn429: true,
     promptTokens: {distribution: constant, mean: 150}}`),
			want: counts{Offered: 3, Refused: Refused{RateLimited: 3}},
		},
		// The requests budget of 6 a minute takes a request whatever its
		// tokens: a burst of 8 without token costs, 6 admitted.
		"the requests budget counts requests": {
			doc:  budgetPool("{requestsPerMinute: 6}") + budgetLoad("10s", "0s", "", `{tenant: a, arrival: {process: burst, at: 0s, count: 8}}`),
			want: counts{Offered: 8, Admitted: 6, Served: 6, Refused: Refused{RateLimited: 2}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			res := runDoc(t, tc.doc)
			if diff := cmp.Diff(tc.want, countsOf(&res.Tiers["t"].Figures)); diff != "" {
				t.Errorf("tier (-want +got):\n%s", diff)
			}
			if tc.slo > 0 && res.Tiers["t"].SLOAttainment != tc.slo {
				t.Errorf("SLO attainment %g, want %g", res.Tiers["t"].SLOAttainment, tc.slo)
			}
		})
	}
}

// slowPool is exactPool's: one slot, a constant 10 s service time, tier
// t with tolerableWait 10 s (bound 1), and the quotas given.
func slowPool(quotas ...string) string {
	doc := exactPool(1, "10s")
	for _, q := range quotas {
		doc += q + "---\n"
	}
	return doc
}

func slowLoad(duration, tenant string) string {
	return fmt.Sprintf("apiVersion: tiergate.dev/v1alpha1\nkind: Load\nspec:\n  replicas: 1\n  duration: %s\n  serviceTime: {distribution: constant, mean: 10s}\n  tenants:\n  - %s\n", duration, tenant)
}

// TestBudgetRefunds: what never reached a backend is refunded entirely,
// request included, and a cancelled generation settles on what it
// streamed.
func TestBudgetRefunds(t *testing.T) {
	tests := map[string]struct {
		doc  string
		want Figures
	}{
		// 3 requests a minute (0.05 a second); bursts of 3 at 0 and 5 s.
		// At 0: a1 runs, a2 queues, a3 is refused by the full queue and
		// refunded (3 → 1). At 5 the bucket holds 1.25: each of a4..a6
		// fits, is refused by the queue and refunded. Without refunds a3
		// would have taken the last request, and a4..a6 would be
		// rate_limited.
		"refused by the queue": {
			doc:  slowPool(budgetQuota("a", "{requestsPerMinute: 3}")) + slowLoad("10s", "{tenant: a, arrival: {process: burst, at: 0s, count: 3, every: 5s}}"),
			want: Figures{Offered: 6, Admitted: 2, Refused: Refused{Capacity: 4}, Wait: WaitStats{Count: 1}},
		},
		// Two queue places (tolerableWait 20 s) and the slot held 0–10 s
		// by b, which has no budget. a has 2 requests a minute; bursts of
		// 2 at 0 and 6 s whose clients give up after 5 s. At 0 a1 and a2
		// queue (2 → 0); at 5 both are withdrawn and refunded (the bucket
		// is full again: 2). At 6 a3 and a4 fit and queue; without the
		// refunds it would hold 0.2 and refuse both. At 10 b1 completes
		// and a3 starts; at 11 a3 is cancelled in flight, a4 starts in its
		// slot and is cancelled at once: waits 0 (b1), 4 s and 5 s.
		"withdrawn from the queue": {
			doc: strings.Replace(slowPool(budgetQuota("a", "{requestsPerMinute: 2}")), "tolerableWait: 10s", "tolerableWait: 20s", 1) +
				slowLoad("12s", "{tenant: b, arrival: {process: burst, at: 0s, count: 1}}\n  - {tenant: a, arrival: {process: burst, at: 0s, count: 2, every: 6s}, timeout: 5s}"),
			want: Figures{Offered: 5, Admitted: 5, Served: 1, Abandoned: 4, AbandonedInFlight: 2,
				Wait: WaitStats{Count: 3, Mean: 3, P50: 4, P95: 5, P99: 5, Max: 5}},
		},
		// 120 tokens a minute (2 a second); requests of 10 prompt and 100
		// output tokens (max_tokens 100) at 0 and 24 s, clients that give
		// up after 5 s. a1 reserves 110 (120 → 10) and is cancelled at 5
		// having streamed half its 10 s: it used 10 + 50, so 50 go back
		// (10 + 10 + 50 = 70). At 24 the bucket holds 108: a2 is refused
		// with Retry-After 1 s and fits at 25 (110). Had a1 settled on
		// its whole reservation the bucket would hold 58 at 24 and 60 at
		// 25; had it given back all of its output, 120 at 24 and no
		// refusal.
		"cancelled in flight settles on what it streamed": {
			doc: slowPool(budgetQuota("a", "{tokensPerMinute: 120}")) + slowLoad("30s", `{tenant: a, arrival: {process: burst, at: 0s, count: 1, every: 24s}, timeout: 5s, retryOn429: true,
     promptTokens: {distribution: constant, mean: 10}, outputTokens: {distribution: constant, mean: 100}, maxTokens: 100}`),
			want: Figures{Offered: 2, Retries: 1, Admitted: 2, Abandoned: 1, AbandonedInFlight: 1, Refused: Refused{RateLimited: 1},
				Wait: WaitStats{Count: 2}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := runDoc(t, tc.doc).Tiers["t"].Figures
			got.OfferedRate, got.Throughput, got.ThroughputShare, got.waits = 0, 0, 0, nil
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(Figures{})); diff != "" {
				t.Errorf("tier figures (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBaselinesHaveNoBudgets: --compare's schedulers get the same
// requests, tokens included, but only tiergate enforces budgets.
func TestBaselinesHaveNoBudgets(t *testing.T) {
	in, err := Read(src("budgets.yaml", budgetPool("", budgetQuota("over", "{tokensPerMinute: 6000}"))+budgetLoad("10m", "2m", "", overTenant)))
	if err != nil {
		t.Fatal(err)
	}
	want := counts{Offered: 960, Admitted: 960, Served: 960, Tokens: TokenCounts{Prompt: 48000, Completion: 48000}}
	for _, kind := range Baselines {
		t.Run(kind, func(t *testing.T) {
			res := runKind(t, in, kind, Options{})
			tr := res.Tenants["over"]
			if diff := cmp.Diff(want, countsOf(&tr.Figures)); diff != "" {
				t.Errorf("over (-want +got):\n%s", diff)
			}
			if tr.Budget != nil {
				t.Errorf("budget %+v under %s", tr.Budget, kind)
			}
		})
	}
}

// TestTokensDeterministic: the same seed gives the same result with
// random token counts and budgets, another seed another, and a tenant's
// tokens come from a stream of their own: giving it tokens changes
// neither its arrivals nor its service times.
func TestTokensDeterministic(t *testing.T) {
	const example = "../examples/simulate/budgets.yaml"
	jsonOf := func(seed uint64) string {
		res, err := Run(read(t, example), Options{Seed: &seed})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := WriteJSON(&b, res); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	first := jsonOf(3)
	if diff := cmp.Diff(first, jsonOf(3)); diff != "" {
		t.Fatalf("same seed, different output (-first +again):\n%s", diff)
	}
	if jsonOf(4) == first {
		t.Error("a different seed gave identical output")
	}

	type arrival struct {
		At, Service time.Duration
	}
	traffic := func(in *Input) []arrival {
		var out []arrival
		opts := Options{onRequest: func(_, tenant string, at, service time.Duration) {
			if tenant == "chat" {
				out = append(out, arrival{at, service})
			}
		}}
		if _, err := Run(in, opts); err != nil {
			t.Fatal(err)
		}
		return out
	}
	with := read(t, example)
	without := read(t, example)
	for i := range without.Load.Spec.Tenants {
		tl := &without.Load.Spec.Tenants[i]
		if tl.Tenant == "chat" {
			tl.PromptTokens, tl.OutputTokens, tl.MaxTokens = nil, nil, nil
		}
	}
	without.Quotas[0].Spec.Limits = nil // chat's; its requests cost nothing now
	if without.Quotas[0].Spec.Tenant != "chat" {
		t.Fatalf("the example's first quota is %s's, not chat's", without.Quotas[0].Spec.Tenant)
	}
	a, b := traffic(with), traffic(without)
	if len(a) < 100 {
		t.Fatalf("chat sent %d requests: not the scenario", len(a))
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("chat's traffic with tokens (-) and without (+):\n%s", diff)
	}
}

func TestTokenDraws(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := map[string]struct {
		spec TokenSpec
		want []int64
	}{
		// math.Round: halves away from zero.
		"constant rounds to the nearest": {spec: TokenSpec{Distribution: DistConstant, Mean: f(2.5)}, want: []int64{3, 3}},
		"constant whole":                 {spec: TokenSpec{Distribution: DistConstant, Mean: f(7)}, want: []int64{7, 7}},
		"constant at the maximum":        {spec: TokenSpec{Distribution: DistConstant, Mean: f(MaxTokenCount)}, want: []int64{MaxTokenCount}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := tokenSampler(&tc.spec)
			r := newTokenRand(1, "x")
			var got []int64
			for range tc.want {
				got = append(got, s.tokens(r))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("draws (-want +got):\n%s", diff)
			}
		})
	}
	// Random draws are whole numbers from 1 to MaxTokenCount, and their
	// mean is that of the rounded distribution (seeded: the same numbers
	// each run). Rounding an exponential of mean m to the nearest whole
	// number, at least 1, gives 1 below 1.5 and k from k − 0.5 on: a mean
	// of P(X < 0.5) + Σ_{k>=1} P(X >= k − 0.5) = 1 − q + q/(1 − e^(−1/m))
	// with q = e^(−0.5/m); 3.1397 for m = 3. A lognormal of mean 300
	// barely moves. tol is about four standard errors of n draws.
	const n = 100000
	q := math.Exp(-0.5 / 3)
	for _, tc := range []struct {
		spec      TokenSpec
		mean, tol float64
	}{
		{spec: TokenSpec{Distribution: DistExponential, Mean: f(3)}, mean: 1 - q + q/(1-math.Exp(-1.0/3)), tol: 0.04},
		{spec: TokenSpec{Distribution: DistLognormal, Mean: f(300), Stddev: f(600)}, mean: 300, tol: 8},
	} {
		s, r := tokenSampler(&tc.spec), newTokenRand(1, tc.spec.Distribution)
		var sum int64
		for range n {
			v := s.tokens(r)
			if v < 1 || v > MaxTokenCount {
				t.Fatalf("%s: drew %d", tc.spec.Distribution, v)
			}
			sum += v
		}
		mean := float64(sum) / n
		t.Logf("%s of mean %g: %d draws (seed 1) have a mean of %.4f, want %.4f ± %g", tc.spec.Distribution, *tc.spec.Mean, n, mean, tc.mean, tc.tol)
		if math.Abs(mean-tc.mean) > tc.tol {
			t.Errorf("%s: mean %.4f of draws, want %.4f ± %g", tc.spec.Distribution, mean, tc.mean, tc.tol)
		}
	}
}

func TestCeilSecond(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{
		time.Millisecond: time.Second, time.Second: time.Second, 1001 * time.Millisecond: 2 * time.Second,
		4286 * time.Millisecond: 5 * time.Second, 0: time.Second,
	} {
		if got := ceilSecond(in); got != want {
			t.Errorf("ceilSecond(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestBudgetInputErrors(t *testing.T) {
	tenant := func(fields string) Source {
		return src("load.yaml", strings.Replace(loadDoc, "arrival: {process: poisson, rate: 1}", "arrival: {process: poisson, rate: 1}\n    "+fields, 1))
	}
	quota := func(limits string) Source {
		return src("q.yaml", "apiVersion: tiergate.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: q}\nspec: {tenant: a, tierRef: {name: free}, limits: "+limits+"}\n")
	}
	const load = `load.yaml: document 1 (Load): invalid: spec.tenants[0].`
	tests := map[string]struct {
		srcs    []Source
		wantErr error
		wantMsg string
	}{
		"prompt tokens without a mean": {
			srcs: []Source{tenant("promptTokens: {distribution: constant}")}, wantErr: ErrInvalid,
			wantMsg: load + `promptTokens.mean: is required`,
		},
		"unknown distribution": {
			srcs: []Source{tenant("outputTokens: {distribution: gamma, mean: 10}")}, wantErr: ErrInvalid,
			wantMsg: load + `outputTokens.distribution: unknown distribution "gamma" (want constant, exponential or lognormal)`,
		},
		"mean below one token": {
			srcs: []Source{tenant("promptTokens: {distribution: exponential, mean: 0.5}")}, wantErr: ErrInvalid,
			wantMsg: load + `promptTokens.mean: must be from 1 to 1000000000, got 0.5`,
		},
		"mean above the maximum": {
			srcs: []Source{tenant("promptTokens: {distribution: constant, mean: 2000000000}")}, wantErr: ErrInvalid,
			wantMsg: load + `promptTokens.mean: must be from 1 to 1000000000, got 2e+09`,
		},
		"stddev with constant": {
			srcs: []Source{tenant("outputTokens: {distribution: constant, mean: 10, stddev: 2}")}, wantErr: ErrInvalid,
			wantMsg: load + `outputTokens.stddev: is only used by distribution lognormal`,
		},
		"lognormal without stddev": {
			srcs: []Source{tenant("outputTokens: {distribution: lognormal, mean: 10}")}, wantErr: ErrInvalid,
			wantMsg: load + `outputTokens.stddev: must be greater than 0 and at most 1000000000 for distribution lognormal`,
		},
		"lognormal with a zero stddev": {
			srcs: []Source{tenant("promptTokens: {distribution: lognormal, mean: 10, stddev: 0}")}, wantErr: ErrInvalid,
			wantMsg: load + `promptTokens.stddev: must be greater than 0 and at most 1000000000 for distribution lognormal`,
		},
		"maxTokens zero": {
			srcs: []Source{tenant("outputTokens: {distribution: constant, mean: 10}\n    maxTokens: 0")}, wantErr: ErrInvalid,
			wantMsg: load + `maxTokens: must be from 1 to 1000000000, got 0`,
		},
		"maxTokens without outputTokens": {
			srcs: []Source{tenant("maxTokens: 100")}, wantErr: ErrInvalid,
			wantMsg: load + `maxTokens: is only used with outputTokens`,
		},
		"several token errors at once": {
			srcs: []Source{tenant("promptTokens: {distribution: lognormal}\n    maxTokens: -1")}, wantErr: ErrInvalid,
			wantMsg: load + `promptTokens.stddev: must be greater than 0 and at most 1000000000 for distribution lognormal; ` +
				`spec.tenants[0].promptTokens.mean: is required; ` +
				`spec.tenants[0].maxTokens: must be from 1 to 1000000000, got -1; ` +
				`spec.tenants[0].maxTokens: is only used with outputTokens`,
		},
		"unknown field in promptTokens": {
			srcs: []Source{tenant("promptTokens: {distribution: constant, median: 10}")}, wantErr: ErrUnknownField,
			wantMsg: `load.yaml: document 1 (Load): unknown field "spec.tenants[0].promptTokens.median"`,
		},
		"a mean that is not a number": {
			srcs: []Source{tenant("promptTokens: {distribution: constant, mean: many}")}, wantErr: ErrSyntax,
			wantMsg: `load.yaml: document 1 (Load): malformed document: json: cannot unmarshal string into Go struct field TokenSpec.spec.tenants.promptTokens.mean of type float64`,
		},
		"quota limits empty": {
			srcs: []Source{quota("{}")}, wantErr: ErrInvalid,
			wantMsg: `q.yaml: document 1 (TenantQuota "q"): invalid: spec.limits: must set requestsPerMinute, tokensPerMinute or both (leave the field out for no budget)`,
		},
		"quota tokens budget zero": {
			srcs: []Source{quota("{tokensPerMinute: 0}")}, wantErr: ErrInvalid,
			wantMsg: `q.yaml: document 1 (TenantQuota "q"): invalid: spec.limits.tokensPerMinute: must be from 1 to 1000000000, got 0`,
		},
		"quota budgets negative and too large": {
			srcs: []Source{quota("{requestsPerMinute: -5, tokensPerMinute: 1000000001}")}, wantErr: ErrInvalid,
			wantMsg: `q.yaml: document 1 (TenantQuota "q"): invalid: spec.limits.requestsPerMinute: must be from 1 to 1000000000, got -5; ` +
				`spec.limits.tokensPerMinute: must be from 1 to 1000000000, got 1000000001`,
		},
		"tier tenantLimits zero": {
			srcs: []Source{src("tiers.yaml", tierDoc+"  tenantLimits: {requestsPerMinute: 0}\n")}, wantErr: ErrInvalid,
			wantMsg: `tiers.yaml: document 1 (ServiceTier "free"): invalid: spec.tenantLimits.requestsPerMinute: must be from 1 to 1000000000, got 0`,
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

// TestRunRefusesATokensBudgetWithoutCosts: a tokens budget over requests
// that cost no tokens would never refuse one; the run says so. A requests
// budget needs no cost.
func TestRunRefusesATokensBudgetWithoutCosts(t *testing.T) {
	for name, tc := range map[string]struct {
		limits, wantMsg string
	}{
		"tokens": {limits: "{tokensPerMinute: 6000}",
			wantMsg: `invalid: Load spec.tenants[0]: tenant "a" has a budget of 6000 tokens per minute but no promptTokens or outputTokens, so its requests would cost no tokens and the budget would never refuse one; give them a cost`},
		"requests": {limits: "{requestsPerMinute: 60}"},
	} {
		t.Run(name, func(t *testing.T) {
			in, err := Read(src("x.yaml", poolDoc+"---\n"+tierDoc+"  tenantLimits: "+tc.limits+"\n---\n"+loadDoc))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Run(in, Options{})
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Run() error = %v, want ErrInvalid", err)
			}
			if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}
