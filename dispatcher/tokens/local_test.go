package tokens

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// step is one call in a TestLocal script: the clock moves by advance,
// then Reserve(reserve) or, when settle is set, Settle(*settle).
type step struct {
	advance time.Duration
	limits  *policy.Limits // nil: the script's
	reserve int64
	settle  *Settlement
	want    Decision
}

func b(limit, remaining int64, reset time.Duration) Bucket {
	return Bucket{Limit: limit, Remaining: remaining, Reset: reset}
}

func TestLocal(t *testing.T) {
	both := policy.Limits{RequestsPerMinute: 10, TokensPerMinute: 1000} // a request every 6 s, a token every 60 ms
	fullReq, fullTok := b(10, 10, 0), b(1000, 1000, 0)
	tests := []struct {
		name   string
		limits policy.Limits
		steps  []step
	}{
		{
			name: "first seen full", limits: both,
			steps: []step{{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 900, 6*time.Second)}}},
		},
		{
			name: "refill", limits: both,
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 900, 6*time.Second)}},
				{advance: 3 * time.Second, want: Decision{OK: true, Requests: b(10, 8, 9*time.Second), Tokens: b(1000, 950, 3*time.Second)}},
				{advance: time.Minute, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: fullTok}},
			},
		},
		{
			name: "Never: more than the whole tokens limit, nothing taken", limits: both,
			steps: []step{
				{reserve: 1001, want: Decision{Budget: BudgetTokens, Never: true, Requests: fullReq, Tokens: fullTok}},
				{reserve: 1000, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
			},
		},
		{
			name: "RetryAfter is exact", limits: both,
			steps: []step{
				{reserve: 1000, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
				{reserve: 300, want: Decision{Budget: BudgetTokens, RetryAfter: 18 * time.Second, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
				{advance: 18*time.Second - time.Millisecond, reserve: 300, want: Decision{Budget: BudgetTokens, RetryAfter: time.Millisecond, Requests: fullReq, Tokens: b(1000, 299, 42001*time.Millisecond)}},
				{advance: time.Millisecond, reserve: 300, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
			},
		},
		{
			name: "both or neither: the requests budget refuses, no tokens are taken", limits: policy.Limits{RequestsPerMinute: 1, TokensPerMinute: 1000},
			steps: []step{
				{reserve: 10, want: Decision{OK: true, Requests: b(1, 0, time.Minute), Tokens: b(1000, 990, 600*time.Millisecond)}},
				{reserve: 10, want: Decision{Budget: BudgetRequests, RetryAfter: time.Minute, Requests: b(1, 0, time.Minute), Tokens: b(1000, 990, 600*time.Millisecond)}},
			},
		},
		{
			name: "both or neither: the tokens budget refuses, no request is taken", limits: policy.Limits{RequestsPerMinute: 10, TokensPerMinute: 100},
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(100, 0, time.Minute)}},
				{reserve: 50, want: Decision{Budget: BudgetTokens, RetryAfter: 30 * time.Second, Requests: b(10, 9, 6*time.Second), Tokens: b(100, 0, time.Minute)}},
			},
		},
		{
			name: "both refuse: the requests budget is named, the later wait given", limits: policy.Limits{RequestsPerMinute: 2, TokensPerMinute: 1000},
			steps: []step{
				{reserve: 500, want: Decision{OK: true, Requests: b(2, 1, 30*time.Second), Tokens: b(1000, 500, 30*time.Second)}},
				{reserve: 500, want: Decision{OK: true, Requests: b(2, 0, time.Minute), Tokens: b(1000, 0, time.Minute)}},
				{advance: 6 * time.Second, reserve: 900, want: Decision{Budget: BudgetRequests, RetryAfter: 48 * time.Second, Requests: b(2, 0, 54*time.Second), Tokens: b(1000, 100, 54*time.Second)}},
			},
		},
		{
			name: "a settlement above the reservation makes the level negative, and later requests wait", limits: both,
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 900, 6*time.Second)}},
				{settle: &Settlement{Reserved: 100, Used: 1500}, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, 90*time.Second)}},
				{reserve: 1, want: Decision{Budget: BudgetTokens, RetryAfter: 30060 * time.Millisecond, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, 90*time.Second)}},
				{advance: 30060 * time.Millisecond, reserve: 1, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
			},
		},
		{
			name: "the debt is at most one window", limits: both,
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 900, 6*time.Second)}},
				{settle: &Settlement{Reserved: 100, Used: 1_000_000}, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, 2*time.Minute)}},
				{reserve: 1000, want: Decision{Budget: BudgetTokens, RetryAfter: 2 * time.Minute, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, 2*time.Minute)}},
				{advance: 2 * time.Minute, reserve: 1000, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
			},
		},
		{
			name: "what was not used goes back", limits: both,
			steps: []step{
				{reserve: 1000, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
				{settle: &Settlement{Reserved: 1000, Used: 300}, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 700, 18*time.Second)}},
			},
		},
		{
			name: "RefundRequest gives the request back", limits: both,
			steps: []step{
				{reserve: 10, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 990, 600*time.Millisecond)}},
				{settle: &Settlement{Reserved: 10, RefundRequest: true}, want: Decision{OK: true, Requests: fullReq, Tokens: fullTok}},
			},
		},
		{
			name: "a lowered limit caps the level, a raised one does not refill it", limits: both,
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 900, 6*time.Second)}},
				{limits: &policy.Limits{RequestsPerMinute: 10, TokensPerMinute: 500}, want: Decision{OK: true, Requests: b(10, 8, 12*time.Second), Tokens: b(500, 500, 0)}},
				{limits: &policy.Limits{RequestsPerMinute: 10, TokensPerMinute: 2000}, want: Decision{OK: true, Requests: b(10, 7, 18*time.Second), Tokens: b(2000, 500, 45*time.Second)}},
			},
		},
		{
			name: "a budget added later starts full", limits: policy.Limits{RequestsPerMinute: 10},
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second)}},
				{limits: &both, reserve: 100, want: Decision{OK: true, Requests: b(10, 8, 12*time.Second), Tokens: b(1000, 900, 6*time.Second)}},
			},
		},
		{
			name: "requests only: any reservation of tokens", limits: policy.Limits{RequestsPerMinute: 10},
			steps: []step{{reserve: 1 << 40, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second)}}},
		},
		{
			name: "tokens only", limits: policy.Limits{TokensPerMinute: 1000},
			steps: []step{
				{reserve: 100, want: Decision{OK: true, Tokens: b(1000, 900, 6*time.Second)}},
				{settle: &Settlement{Reserved: 100, Used: 40, RefundRequest: true}, want: Decision{OK: true, Tokens: b(1000, 960, 2400*time.Millisecond)}},
			},
		},
		{
			name: "no budget: OK with zero buckets",
			steps: []step{
				{reserve: 1 << 40, want: Decision{OK: true}},
				{settle: &Settlement{Reserved: 1, Used: 1 << 40, RefundRequest: true}, want: Decision{OK: true}},
			},
		},
		{
			name: "a clock going back adds nothing", limits: both,
			steps: []step{
				{reserve: 600, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 400, 36*time.Second)}},
				{advance: -10 * time.Second, want: Decision{OK: true, Requests: b(10, 8, 12*time.Second), Tokens: b(1000, 400, 36*time.Second)}},
				{advance: 10 * time.Second, want: Decision{OK: true, Requests: b(10, 7, 18*time.Second), Tokens: b(1000, 400, 36*time.Second)}},
				{advance: 6 * time.Second, want: Decision{OK: true, Requests: b(10, 7, 18*time.Second), Tokens: b(1000, 500, 30*time.Second)}},
			},
		},
		{
			name: "a key idle for two windows is full again", limits: both,
			steps: []step{
				{reserve: 1000, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
				{advance: 2 * Window, reserve: 1000, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 0, time.Minute)}},
				{advance: 5 * Window, reserve: 1, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: b(1000, 999, 60*time.Millisecond)}},
			},
		},
		{
			name: "a negative reservation reserves nothing", limits: both,
			steps: []step{{reserve: -50, want: Decision{OK: true, Requests: b(10, 9, 6*time.Second), Tokens: fullTok}}},
		},
	}
	ctx := context.Background()
	key := Key{Pool: "default/pool", Tenant: "acme"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(t0)
			l := NewLocal(clk)
			for i, s := range tt.steps {
				clk.SetTime(clk.Now().Add(s.advance))
				lim := tt.limits
				if s.limits != nil {
					lim = *s.limits
				}
				var got Decision
				var err error
				if s.settle != nil {
					got, err = l.Settle(ctx, key, lim, *s.settle)
				} else {
					got, err = l.Reserve(ctx, key, lim, s.reserve)
				}
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if diff := cmp.Diff(s.want, got); diff != "" {
					t.Errorf("step %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

// TestLocalKeys: tenants and pools have buckets of their own.
func TestLocalKeys(t *testing.T) {
	ctx := context.Background()
	l := NewLocal(clocktesting.NewFakePassiveClock(t0))
	lim := policy.Limits{TokensPerMinute: 100}
	var got []bool
	for _, k := range []Key{{"p", "a"}, {"p", "a"}, {"p", "b"}, {"q", "a"}} {
		d, _ := l.Reserve(ctx, k, lim, 60)
		got = append(got, d.OK)
	}
	if diff := cmp.Diff([]bool{true, false, true, true}, got); diff != "" {
		t.Errorf("admitted (-want +got):\n%s", diff)
	}
}

// TestLocalForgets: a key idle for more than two windows is dropped, on
// the calls of others; one in use is kept; a tenant without a budget is
// never stored.
func TestLocalForgets(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(t0)
	l := NewLocal(clk)
	lim := policy.Limits{RequestsPerMinute: 5}
	a, b, c := Key{"p", "a"}, Key{"p", "b"}, Key{"p", "c"}
	var sizes []int
	call := func(advance time.Duration, k Key, lim policy.Limits) {
		clk.SetTime(clk.Now().Add(advance))
		if _, err := l.Reserve(ctx, k, lim, 1); err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, l.size())
	}
	call(0, a, lim)
	call(0, b, lim)
	call(0, c, policy.Limits{}) // no budget: not stored
	call(2*Window, b, lim)      // a generation ends: a and b are kept
	call(Window, b, lim)
	call(Window, b, lim) // the next one ends: a, idle for 4 windows, goes
	call(10*Window, c, lim)
	if diff := cmp.Diff([]int{1, 2, 2, 2, 2, 1, 1}, sizes); diff != "" {
		t.Errorf("keys remembered (-want +got):\n%s", diff)
	}
}

// TestLocalConcurrent: concurrent reservations on one key admit exactly
// the budget, and concurrent settlements give back exactly what they
// should (for -race too).
func TestLocalConcurrent(t *testing.T) {
	ctx := context.Background()
	l := NewLocal(clocktesting.NewFakePassiveClock(t0))
	k, lim := Key{"p", "t"}, policy.Limits{RequestsPerMinute: 300, TokensPerMinute: 30000}
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				d, err := l.Reserve(ctx, k, lim, 50)
				if err != nil {
					t.Error(err)
					return
				}
				if d.OK {
					ok.Add(1)
					if _, err := l.Settle(ctx, k, lim, Settlement{Reserved: 50, Used: 20}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	d, _ := l.Reserve(ctx, k, lim, 0)
	// 300 requests of 20 tokens: the request budget binds, 24000 tokens stay.
	want := Decision{Budget: BudgetRequests, RetryAfter: 200 * time.Millisecond, Requests: b(300, 0, time.Minute), Tokens: b(30000, 24000, 12*time.Second)}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("after the load (-want +got):\n%s", diff)
	}
	if got := ok.Load(); got != 300 {
		t.Errorf("admitted %d, want 300", got)
	}
}
