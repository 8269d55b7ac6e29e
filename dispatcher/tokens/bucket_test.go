package tokens

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

const u = UnitsPerToken

func TestRefill(t *testing.T) {
	const c = 60 // one token a second: 60 units a millisecond
	full := int64(c) * u
	tests := []struct {
		name  string
		s     State
		limit int64
		now   int64
		want  State
	}{
		{"never seen: full", State{}, c, 5000, State{full, 5000, true}},
		{"refills a token a second", State{0, 1000, true}, c, 31000, State{30 * u, 31000, true}},
		{"a partial token", State{0, 1000, true}, c, 1500, State{u / 2, 1500, true}},
		{"capped at full", State{full - u, 0, true}, c, 10000, State{full, 10000, true}},
		{"a clock going back adds nothing", State{7 * u, 10000, true}, c, 5000, State{7 * u, 10000, true}},
		{"idle two windows: full, even from the floor", State{-full, 0, true}, c, IdleMillis, State{full, IdleMillis, true}},
		{"just under two windows from the floor", State{-full, 0, true}, c, IdleMillis - 1, State{full - c, IdleMillis - 1, true}},
		{"a lowered limit caps", State{200 * u, 0, true}, c, 0, State{full, 0, true}},
		{"a lowered limit floors the debt", State{-200 * u, 0, true}, c, 1000, State{-full + 60*1000, 1000, true}},
		{"a raised limit does not refill", State{full, 0, true}, 2 * c, 0, State{full, 0, true}},
		{"a limit above MaxLimit is MaxLimit", State{}, 1 << 50, 0, State{MaxLimit * u, 0, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Refill(tt.s, tt.limit, tt.now)); diff != "" {
				t.Errorf("Refill(%+v, %d, %d) (-want +got):\n%s", tt.s, tt.limit, tt.now, diff)
			}
		})
	}
}

func TestWaitAndBucket(t *testing.T) {
	const c = 1000 // a token every 60 ms
	type result struct {
		Wait   time.Duration
		Bucket Bucket
	}
	tests := []struct {
		name  string
		level int64
		n     int64
		want  result
	}{
		{"full", c * u, 1000, result{0, Bucket{c, c, 0}}},
		{"holds it", 500 * u, 500, result{0, Bucket{c, 500, 30 * time.Second}}},
		{"short by one token", 499 * u, 500, result{60 * time.Millisecond, Bucket{c, 499, 30060 * time.Millisecond}}},
		{"short by a sliver: at least a millisecond", 500*u - 1, 500, result{time.Millisecond, Bucket{c, 499, 30001 * time.Millisecond}}},
		{"a part of a token rounds down", 500*u + u/2, 0, result{0, Bucket{c, 500, 29970 * time.Millisecond}}},
		{"in debt", -300 * u, 1, result{301 * 60 * time.Millisecond, Bucket{c, 0, 78 * time.Second}}},
		{"in debt by a part of a token", -u / 2, 0, result{30 * time.Millisecond, Bucket{c, 0, 60030 * time.Millisecond}}},
		{"empty, the whole limit", 0, c, result{time.Minute, Bucket{c, 0, time.Minute}}},
		{"the floor, the whole limit", -c * u, c, result{2 * time.Minute, Bucket{c, 0, 2 * time.Minute}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Level: tt.level, Seen: true}
			got := result{s.Wait(c, tt.n), s.Bucket(c)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("level %d, %d tokens (-want +got):\n%s", tt.level, tt.n, diff)
			}
		})
	}
}

func TestGive(t *testing.T) {
	const c = 100
	tests := []struct {
		name      string
		level, d  int64
		wantLevel int64
	}{
		{"gives back", 10 * u, 30, 40 * u},
		{"takes", 10 * u, -30, -20 * u},
		{"capped at full", 90 * u, 30, 100 * u},
		{"floored at one window's debt", 10 * u, -1000, -100 * u},
		{"a huge difference saturates", 0, -1 << 62, -100 * u},
		{"and the other way", 0, 1 << 62, 100 * u},
	}
	for _, tt := range tests {
		got := State{Level: tt.level, Seen: true}.give(c, tt.d).Level
		if diff := cmp.Diff(tt.wantLevel, got); diff != "" {
			t.Errorf("%s: give(%d) from %d (-want +got):\n%s", tt.name, tt.d, tt.level, diff)
		}
	}
}

// TestBucketProperties drives ReserveAt and SettleAt with random limits,
// reservations, settlements and steps of time, and checks after each call:
// levels stay within [−F, F]; a reservation takes 1 and T from both or
// neither; Never is exactly a reservation above the tokens limit; the
// headers are consistent; and a refused reservation, tried again after
// exactly its RetryAfter with nothing in between, is admitted, while one
// millisecond earlier it is still refused. The seed is logged.
func TestBucketProperties(t *testing.T) {
	rng := testSeed(t)
	limitsOf := []int64{0, 1, 3, 10, 60, 1000, 60000, 1 << 40}
	for run := range 200 {
		l := policy.Limits{
			RequestsPerMinute: limitsOf[rng.IntN(len(limitsOf))],
			TokensPerMinute:   limitsOf[rng.IntN(len(limitsOf))],
		}
		var b Buckets
		now := int64(1_700_000_000_000)
		for op := range 200 {
			where := fmt.Sprintf("run %d op %d, limits %+v, buckets %+v", run, op, l, b)
			now += []int64{0, 1, 17, 999, 6000, 59999, 200000}[rng.IntN(7)]
			if rng.IntN(4) == 0 {
				s := Settlement{Reserved: rng.Int64N(2000), Used: rng.Int64N(4000), RefundRequest: rng.IntN(3) == 0}
				var d Decision
				b, d = SettleAt(b, l, s, now)
				checkBuckets(t, where, b, l, d)
				continue
			}
			tokens := []int64{0, 1, 50, 999, 1000, 1001, 70000}[rng.IntN(7)]
			before := b
			var d Decision
			b, d = ReserveAt(b, l, tokens, now)
			checkBuckets(t, where, b, l, d)
			checkReserve(t, where, before, b, l, tokens, now, d)
		}
	}
}

func checkBuckets(t *testing.T, where string, b Buckets, l policy.Limits, d Decision) {
	t.Helper()
	for _, x := range []struct {
		limit int64
		s     State
		got   Bucket
	}{{l.RequestsPerMinute, b.Requests, d.Requests}, {l.TokensPerMinute, b.Tokens, d.Tokens}} {
		c := effectiveLimit(x.limit)
		if c == 0 {
			if x.got != (Bucket{}) {
				t.Fatalf("%s: a bucket %+v for no budget", where, x.got)
			}
			continue
		}
		full := c * u
		if x.s.Level < -full || x.s.Level > full {
			t.Fatalf("%s: level %d outside [−%d, %d]", where, x.s.Level, full, full)
		}
		if x.got.Limit != c || x.got.Remaining < 0 || x.got.Remaining > c ||
			x.got.Reset < 0 || x.got.Reset > 2*Window || (x.got.Reset == 0) != (x.s.Level == full) {
			t.Fatalf("%s: bucket %+v for level %d of %d", where, x.got, x.s.Level, full)
		}
	}
}

func checkReserve(t *testing.T, where string, before, after Buckets, l policy.Limits, tokens, now int64, d Decision) {
	t.Helper()
	rl, tl := effectiveLimit(l.RequestsPerMinute), effectiveLimit(l.TokensPerMinute)
	refilled := before
	if rl > 0 {
		refilled.Requests = Refill(before.Requests, rl, now)
	}
	if tl > 0 {
		refilled.Tokens = Refill(before.Tokens, tl, now)
	}
	if never := tl > 0 && tokens > tl; d.Never != never || (never && (d.OK || d.Budget != BudgetTokens || d.RetryAfter != 0)) {
		t.Fatalf("%s: reserving %d: %+v", where, tokens, d)
	}
	if !d.OK {
		if after != refilled {
			t.Fatalf("%s: a refusal took something: %+v, then %+v", where, refilled, after)
		}
		if d.Never {
			return
		}
		if d.RetryAfter < time.Millisecond || d.RetryAfter%time.Millisecond != 0 {
			t.Fatalf("%s: RetryAfter %v", where, d.RetryAfter)
		}
		ms := int64(d.RetryAfter / time.Millisecond)
		if ms > 1 {
			if _, early := ReserveAt(after, l, tokens, now+ms-1); early.OK {
				t.Fatalf("%s: %+v, yet admitted a millisecond early", where, d)
			}
		}
		if _, retry := ReserveAt(after, l, tokens, now+ms); !retry.OK {
			t.Fatalf("%s: %+v, and refused again after it: %+v", where, d, retry)
		}
		return
	}
	want := refilled
	if rl > 0 {
		want.Requests.Level -= u
	}
	if tl > 0 {
		want.Tokens.Level -= tokens * u
	}
	if after != want || d.Budget != "" || d.RetryAfter != 0 {
		t.Fatalf("%s: admitted %d tokens: %+v, buckets %+v, want %+v", where, tokens, d, after, want)
	}
	if (rl > 0 && refilled.Requests.Level < u) || (tl > 0 && refilled.Tokens.Level < tokens*u) {
		t.Fatalf("%s: admitted %d tokens from %+v", where, tokens, refilled)
	}
}
