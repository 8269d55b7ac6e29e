package tokens

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestHeaders(t *testing.T) {
	tests := []struct {
		name string
		d    Decision
		want [][2]string
	}{
		{name: "no budget", d: Decision{OK: true}},
		{
			name: "both budgets",
			d:    Decision{OK: true, Requests: b(60, 59, 1500*time.Millisecond), Tokens: b(60000, 58700, 6*time.Minute)},
			want: [][2]string{
				{"x-ratelimit-limit-requests", "60"},
				{"x-ratelimit-remaining-requests", "59"},
				{"x-ratelimit-reset-requests", "1.5s"},
				{"x-ratelimit-limit-tokens", "60000"},
				{"x-ratelimit-remaining-tokens", "58700"},
				{"x-ratelimit-reset-tokens", "6m0s"},
			},
		},
		{
			name: "tokens only, on a refusal",
			d:    Decision{Budget: BudgetTokens, RetryAfter: time.Second, Tokens: b(1000, 0, 20*time.Millisecond)},
			want: [][2]string{
				{"x-ratelimit-limit-tokens", "1000"},
				{"x-ratelimit-remaining-tokens", "0"},
				{"x-ratelimit-reset-tokens", "20ms"},
			},
		},
		{
			name: "requests only, full: reset 0s; a reset rounds to the millisecond",
			d:    Decision{OK: true, Requests: b(5, 5, 0), Tokens: Bucket{Remaining: 3, Reset: time.Second}},
			want: [][2]string{
				{"x-ratelimit-limit-requests", "5"},
				{"x-ratelimit-remaining-requests", "5"},
				{"x-ratelimit-reset-requests", "0s"},
			},
		},
		{
			name: "rounding and a negative reset",
			d:    Decision{OK: true, Requests: b(5, 1, 1499600*time.Microsecond), Tokens: b(10, 2, -time.Second)},
			want: [][2]string{
				{"x-ratelimit-limit-requests", "5"},
				{"x-ratelimit-remaining-requests", "1"},
				{"x-ratelimit-reset-requests", "1.5s"},
				{"x-ratelimit-limit-tokens", "10"},
				{"x-ratelimit-remaining-tokens", "2"},
				{"x-ratelimit-reset-tokens", "0s"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Headers(tt.d)); diff != "" {
				t.Errorf("Headers(%+v) (-want +got):\n%s", tt.d, diff)
			}
		})
	}
}

// TestLocalHeaders: the headers of a Local's decisions, the way the data
// path gets them, for a tenant of 60 requests and 60000 tokens a minute.
func TestLocalHeaders(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(t0)
	l := NewLocal(clk)
	k, lim := Key{"p", "acme"}, policy.Limits{RequestsPerMinute: 60, TokensPerMinute: 60000}
	if _, err := l.Reserve(ctx, k, lim, 1300); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(250 * time.Millisecond))
	d, _ := l.Settle(ctx, k, lim, Settlement{Reserved: 1300, Used: 1000})
	want := [][2]string{
		{HeaderLimitRequests, "60"},
		{HeaderRemainingRequests, "59"},
		{HeaderResetRequests, "750ms"},
		{HeaderLimitTokens, "60000"},
		{HeaderRemainingTokens, "59250"},
		{HeaderResetTokens, "750ms"},
	}
	if diff := cmp.Diff(want, Headers(d)); diff != "" {
		t.Errorf("Headers after a settlement (-want +got):\n%s", diff)
	}
}
