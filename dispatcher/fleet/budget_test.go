package fleet

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
	"github.com/tiergate/tiergate/internal/redistest"
)

var (
	budgetKey    = tokens.Key{Pool: "ns/llm", Tenant: "acme"}
	budgetLimits = policy.Limits{RequestsPerMinute: 60, TokensPerMinute: 6000}
	tokensOnly   = policy.Limits{TokensPerMinute: 6000}
)

// U is a token in the scripts' units; F6000 a full bucket of 6000.
const (
	U     = budgetUnits
	F6000 = 6000 * U
)

// stored is one bucket's fields in the budget hash: its level in units and
// its time as an offset from Redis's clock in ms. The tables store times
// 10s ahead (a clock that went backwards): the script then refills nothing
// and keeps the time, so every answer is exact.
type stored struct{ level, offMs int64 }

const ahead = 10_000

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// TestBudgetScripts runs Reserve and Settle on stored buckets and checks
// the Decision and what they store, exactly; the numbers are those of
// the tokens package's bucket maths.
func TestBudgetScripts(t *testing.T) {
	tests := map[string]struct {
		req, tok *stored // nil: the field is not stored
		l        policy.Limits
		reserve  int64
		settle   *tokens.Settlement
		want     tokens.Decision
		wantReq  string // the level stored after; "" for none
		wantTok  string
	}{
		"a new tenant is full": {
			l: budgetLimits, reserve: 100,
			want: tokens.Decision{OK: true,
				Requests: tokens.Bucket{Limit: 60, Remaining: 59, Reset: time.Second},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 5900, Reset: time.Second}},
			wantReq: "3540000", wantTok: "354000000",
		},
		"taken from both": {
			req: &stored{59 * U, ahead}, tok: &stored{5900 * U, ahead}, l: budgetLimits, reserve: 100,
			want: tokens.Decision{OK: true,
				Requests: tokens.Bucket{Limit: 60, Remaining: 58, Reset: 2 * time.Second},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 5800, Reset: 2 * time.Second}},
			wantReq: "3480000", wantTok: "348000000",
		},
		"tokens short: nothing taken, the wait until they fit": {
			req: &stored{59 * U, ahead}, tok: &stored{1_530_000, ahead}, l: budgetLimits, reserve: 100,
			want: tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: ms(745),
				Requests: tokens.Bucket{Limit: 60, Remaining: 59, Reset: time.Second},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 25, Reset: ms(59745)}},
			wantReq: "3540000", wantTok: "1530000",
		},
		"requests short": {
			req: &stored{15_000, ahead}, tok: &stored{F6000, ahead}, l: budgetLimits, reserve: 1,
			want: tokens.Decision{Budget: tokens.BudgetRequests, RetryAfter: ms(750),
				Requests: tokens.Bucket{Limit: 60, Remaining: 0, Reset: ms(59750)},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 6000}},
			wantReq: "15000", wantTok: "360000000",
		},
		"both short: the requests budget named, the longer wait": {
			req: &stored{30_000, ahead}, tok: &stored{-100 * U, ahead}, l: budgetLimits, reserve: 200,
			want: tokens.Decision{Budget: tokens.BudgetRequests, RetryAfter: 3 * time.Second,
				Requests: tokens.Bucket{Limit: 60, Remaining: 0, Reset: ms(59500)},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 0, Reset: 61 * time.Second}},
			wantReq: "30000", wantTok: "-6000000",
		},
		"more than the whole limit is never, even with no request left": {
			req: &stored{0, ahead}, tok: &stored{F6000, ahead}, l: budgetLimits, reserve: 6001,
			want: tokens.Decision{Budget: tokens.BudgetTokens, Never: true,
				Requests: tokens.Bucket{Limit: 60, Remaining: 0, Reset: time.Minute},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 6000}},
			wantReq: "0", wantTok: "360000000",
		},
		"a wait is at least 1ms": {
			tok: &stored{100*U - 1, ahead}, l: tokensOnly, reserve: 100,
			want: tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: time.Millisecond,
				Tokens: tokens.Bucket{Limit: 6000, Remaining: 99, Reset: ms(59001)}},
			wantTok: "5999999",
		},
		"a level below a window's debt counts as that": {
			tok: &stored{-10 * F6000, ahead}, l: tokensOnly, reserve: 0,
			want: tokens.Decision{Budget: tokens.BudgetTokens, RetryAfter: time.Minute,
				Tokens: tokens.Bucket{Limit: 6000, Remaining: 0, Reset: 2 * time.Minute}},
			wantTok: "-360000000",
		},
		"a lowered limit caps the level": {
			tok: &stored{F6000, ahead}, l: policy.Limits{TokensPerMinute: 3000}, reserve: 0,
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 3000, Remaining: 3000}},
			wantTok: "180000000",
		},
		"idle for two windows: full again": {
			tok: &stored{-F6000, -2*U - 1000}, l: tokensOnly, reserve: 100,
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 5900, Reset: time.Second}},
			wantTok: "354000000",
		},
		"a limit above the largest counts as it": {
			l: policy.Limits{TokensPerMinute: 1 << 40}, reserve: 1,
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 1e9, Remaining: 1e9 - 1, Reset: time.Millisecond}},
			wantTok: "59999999940000",
		},
		"a negative reservation takes no tokens": {
			tok: &stored{10 * U, ahead}, l: tokensOnly, reserve: -5,
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 10, Reset: ms(59900)}},
			wantTok: "600000",
		},
		"settle gives back what was not used": {
			tok: &stored{5000 * U, ahead}, l: tokensOnly, settle: &tokens.Settlement{Reserved: 1000, Used: 400},
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 5600, Reset: 4 * time.Second}},
			wantTok: "336000000",
		},
		"settle takes what was used beyond, below 0": {
			tok: &stored{0, ahead}, l: tokensOnly, settle: &tokens.Settlement{Reserved: 0, Used: 100},
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 0, Reset: 61 * time.Second}},
			wantTok: "-6000000",
		},
		"a settlement takes at most two windows' worth": {
			tok: &stored{F6000, ahead}, l: tokensOnly, settle: &tokens.Settlement{Reserved: 0, Used: 100_000},
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 0, Reset: 2 * time.Minute}},
			wantTok: "-360000000",
		},
		"a level never goes below a window's debt": {
			tok: &stored{-F6000 + U, ahead}, l: tokensOnly, settle: &tokens.Settlement{Reserved: 0, Used: 10},
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 0, Reset: 2 * time.Minute}},
			wantTok: "-360000000",
		},
		"negative counts settle as 0": {
			tok: &stored{5000 * U, ahead}, l: tokensOnly, settle: &tokens.Settlement{Reserved: -50, Used: -100},
			want:    tokens.Decision{OK: true, Tokens: tokens.Bucket{Limit: 6000, Remaining: 5000, Reset: 10 * time.Second}},
			wantTok: "300000000",
		},
		"a refund gives the request back, and the tokens": {
			req: &stored{0, ahead}, tok: &stored{5900 * U, ahead}, l: budgetLimits,
			settle: &tokens.Settlement{Reserved: 100, Used: 0, RefundRequest: true},
			want: tokens.Decision{OK: true,
				Requests: tokens.Bucket{Limit: 60, Remaining: 1, Reset: 59 * time.Second},
				Tokens:   tokens.Bucket{Limit: 6000, Remaining: 6000}},
			wantReq: "60000", wantTok: "360000000",
		},
		"a refund caps at the limit": {
			req: &stored{60 * U, ahead}, l: policy.Limits{RequestsPerMinute: 60},
			settle:  &tokens.Settlement{RefundRequest: true},
			want:    tokens.Decision{OK: true, Requests: tokens.Bucket{Limit: 60, Remaining: 60}},
			wantReq: "3600000",
		},
	}
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	b := newGate(t, s, "d0", Config{}).Budgets()
	ctx := context.Background()
	key := keysFor(budgetKey.Pool).budget(budgetKey.Tenant)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c.Del(ctx, key)
			now := redisNowMs(t, c)
			seedBucket(t, c, key, "rl", "rt", tc.req, now)
			seedBucket(t, c, key, "tl", "tt", tc.tok, now)
			var d tokens.Decision
			var err error
			if tc.settle != nil {
				d, err = b.Settle(ctx, budgetKey, tc.l, *tc.settle)
			} else {
				d, err = b.Reserve(ctx, budgetKey, tc.l, tc.reserve)
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, d); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			h := c.HGetAll(ctx, key).Val()
			if h["rl"] != tc.wantReq || h["tl"] != tc.wantTok {
				t.Errorf("stored levels %q and %q, want %q and %q", h["rl"], h["tl"], tc.wantReq, tc.wantTok)
			}
			// A time ahead of Redis's clock is kept; one behind becomes now.
			for _, f := range []struct {
				name string
				s    *stored
			}{{"rt", tc.req}, {"tt", tc.tok}} {
				if f.s == nil || f.s.offMs != ahead {
					continue
				}
				if want := strconv.FormatInt(now+ahead, 10); h[f.name] != want {
					t.Errorf("%s = %s, want the later time %s kept", f.name, h[f.name], want)
				}
			}
		})
	}
}

func seedBucket(t *testing.T, c *redis.Client, key, levelField, timeField string, s *stored, now int64) {
	t.Helper()
	if s == nil {
		return
	}
	err := c.HSet(context.Background(), key, levelField, strconv.FormatInt(s.level, 10),
		timeField, strconv.FormatInt(now+s.offMs, 10)).Err()
	if err != nil {
		t.Fatal(err)
	}
}

// TestBudgetKeysCarryThePoolTagAndExpire: a tenant's budgets are one hash
// under the pool's hash tag, holding the levels and the Redis times the
// next call refills from, and expiring two windows after the last call,
// refusals included, when a bucket is full whatever it held.
func TestBudgetKeysCarryThePoolTagAndExpire(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ctx := context.Background()
	b := newGate(t, s, "d0", Config{}).Budgets()
	before := redisNowMs(t, c)
	if _, err := b.Reserve(ctx, budgetKey, budgetLimits, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, tokens.Key{Pool: "ns/llm", Tenant: "beta"}, policy.Limits{}, 100); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	key := "tg:{ns/llm}:budget:acme"
	if diff := cmp.Diff([]string{key}, keys); diff != "" {
		t.Fatalf("keys (-want +got); a tenant without a budget stores nothing:\n%s", diff)
	}
	if hashTag(key) != "ns/llm" {
		t.Errorf("hash tag %q", hashTag(key))
	}
	h := c.HGetAll(ctx, key).Val()
	if h["rl"] != "3540000" || h["tl"] != "354000000" || h["rt"] != h["tt"] {
		t.Errorf("hash %v, want levels of 59 and 5900 tokens at one time", h)
	}
	if at, _ := strconv.ParseInt(h["tt"], 10, 64); at < before || at > redisNowMs(t, c) {
		t.Errorf("time %s ms, want Redis's clock (%d ms before the call)", h["tt"], before)
	}
	window := tokens.Window.Milliseconds()
	if ttl := c.PTTL(ctx, key).Val().Milliseconds(); ttl <= 2*window-5000 || ttl > 2*window {
		t.Errorf("PTTL %dms, want two windows (%dms)", ttl, 2*window)
	}
	c.PExpire(ctx, key, time.Second)
	d, err := b.Reserve(ctx, budgetKey, budgetLimits, 6000)
	if err != nil || d.OK {
		t.Fatalf("Reserve of 6000 of 5900: %+v, %v; want refused", d, err)
	}
	if ttl := c.PTTL(ctx, key).Val().Milliseconds(); ttl <= 2*window-5000 {
		t.Errorf("PTTL %dms after a refusal, want two windows again", ttl)
	}
	// A forgotten key is a full bucket.
	c.Del(ctx, key)
	d, err = b.Reserve(ctx, budgetKey, budgetLimits, 6000)
	if err != nil || !d.OK || d.Tokens.Remaining != 0 || d.Requests.Remaining != 59 {
		t.Errorf("Reserve of 6000 after the key expired: %+v, %v; want a full bucket", d, err)
	}
}

func TestBudgetDecisionRefusesOtherReplies(t *testing.T) {
	for _, v := range []any{
		"OK",
		[]any{int64(0), int64(0)},
		[]any{int64(4), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0)},
		[]any{"0", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0)},
	} {
		if _, err := budgetDecision(opReserve, v); !errors.Is(err, errReply) {
			t.Errorf("%#v: err %v, want errReply", v, err)
		}
	}
}
