package tokens

import (
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// The bucket maths, shared by Local and mirrored by the Redis script.
//
// A bucket's level is kept in integer units, UnitsPerToken (U = 60000,
// one Window in milliseconds) per token, and time in whole Unix
// milliseconds, so that a bucket of limit C per minute refills exactly C
// units per millisecond. Every value stays an integer below 2^53 (and its
// stored level below 10^14), so Go's int64 and the doubles of Redis's Lua
// 5.1 compute the same numbers, and Lua's tostring stores them exactly.
//
// With C = min(limit, MaxLimit) > 0, F = C × U (full), a stored state
// (L, last, seen) and now (Unix ms):
//
//	refill:   if not seen or now − last >= 2U:  L = F   (new, or idle 2 windows)
//	          else:  L = max(L, −F)
//	                 L = min(F, L + C × max(0, now − last))
//	          last = max(last, now)                     (a clock going back adds nothing)
//	holds n:  L >= n × U                                (n >= 0)
//	take n:   L = L − n × U
//	give d:   d = max(−2C, min(2C, d))                  (settle: d = reserved − used;
//	          L = max(−F, min(F, L + d × U))             refund of a request: d = 1)
//	wait n:   max(1, ceil((n × U − L) ÷ C)) ms          (n <= C, L < n × U)
//	headers:  Remaining = max(0, floor(L ÷ U)), Reset = ceil((F − L) ÷ C) ms
//
// The level never goes below −F: a bucket owes at most one window, so a
// bucket idle for two windows is full again, and forgetting it (Local's
// sweep, a Redis key's expiry) changes nothing. A lowered limit caps the
// level at the new F at the next refill; a raised one does not refill it.
// floor and ceil of a quotient agree too: with numerator and divisor
// integers below 2^53, a double's rounding error is smaller than the
// distance of an inexact quotient to the next integer.

// UnitsPerToken is a bucket level's units per token: Window in
// milliseconds.
const UnitsPerToken = int64(Window / time.Millisecond)

// MaxLimit is the largest limit the maths keeps exact; a larger limit
// counts as MaxLimit.
const MaxLimit = 1_000_000_000

// IdleMillis is how long a bucket is left alone before it is full whatever
// it held: two windows.
const IdleMillis = 2 * UnitsPerToken

// State is one bucket as stored. The zero State is a bucket never used,
// which is full.
type State struct {
	// Level is in units: UnitsPerToken per token; within [−F, F].
	Level int64
	// Last is when Level was computed, in Unix milliseconds.
	Last int64
	// Seen is false for a bucket never used.
	Seen bool
}

// Buckets are one key's two buckets as stored. A budget the limits do not
// have leaves its State alone.
type Buckets struct {
	Requests, Tokens State
}

// effectiveLimit is a limit as the maths uses it: 0 for no budget, at
// most MaxLimit.
func effectiveLimit(limit int64) int64 { return min(max(limit, 0), MaxLimit) }

// Refill is s at now under limit (> 0): the one step every call starts
// with.
func Refill(s State, limit, now int64) State {
	c := effectiveLimit(limit)
	full := c * UnitsPerToken
	if !s.Seen || now-s.Last >= IdleMillis {
		return State{Level: full, Last: max(s.Last, now), Seen: true}
	}
	level := max(s.Level, -full)
	level = min(full, level+c*max(0, now-s.Last))
	return State{Level: level, Last: max(s.Last, now), Seen: true}
}

// holds is whether s holds n tokens.
func (s State) holds(n int64) bool { return s.Level >= n*UnitsPerToken }

// give adds d tokens (negative: takes them) to s, within [−F, F].
func (s State) give(limit, d int64) State {
	c := effectiveLimit(limit)
	full := c * UnitsPerToken
	d = max(-2*c, min(2*c, d))
	s.Level = max(-full, min(full, s.Level+d*UnitsPerToken))
	return s
}

// Wait is the time until s holds n tokens (n <= limit) with nothing else
// taken from it, at least 1 ms; 0 when it holds them already.
func (s State) Wait(limit, n int64) time.Duration {
	if s.holds(n) {
		return 0
	}
	c := effectiveLimit(limit)
	ms := ceilDiv(n*UnitsPerToken-s.Level, c)
	return time.Duration(max(ms, 1)) * time.Millisecond
}

// Bucket is s for the x-ratelimit-* headers.
func (s State) Bucket(limit int64) Bucket {
	c := effectiveLimit(limit)
	return Bucket{
		Limit:     c,
		Remaining: max(0, s.Level/UnitsPerToken),
		Reset:     time.Duration(ceilDiv(c*UnitsPerToken-s.Level, c)) * time.Millisecond,
	}
}

// ceilDiv is ⌈a ÷ b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// ReserveAt is Limiter.Reserve over a key's stored buckets at now (Unix
// ms): the buckets to store and the decision. It takes 1 from the
// requests bucket and tokens from the tokens bucket, from both or
// neither. A refusal names the requests budget when both refuse, except
// that a reservation larger than the whole tokens limit is refused by the
// tokens budget as Never, since no wait admits it. RetryAfter is the later
// of the refusing buckets' waits.
func ReserveAt(b Buckets, l policy.Limits, tokens, now int64) (Buckets, Decision) {
	tokens = max(tokens, 0)
	rl, tl := effectiveLimit(l.RequestsPerMinute), effectiveLimit(l.TokensPerMinute)
	if rl > 0 {
		b.Requests = Refill(b.Requests, rl, now)
	}
	if tl > 0 {
		b.Tokens = Refill(b.Tokens, tl, now)
	}
	reqShort := rl > 0 && !b.Requests.holds(1)
	tokShort := tl > 0 && !b.Tokens.holds(tokens)
	var d Decision
	switch {
	case tl > 0 && tokens > tl:
		d = Decision{Budget: BudgetTokens, Never: true}
	case reqShort || tokShort:
		d.Budget = BudgetTokens
		if reqShort {
			d.Budget = BudgetRequests
			d.RetryAfter = b.Requests.Wait(rl, 1)
		}
		if tokShort {
			d.RetryAfter = max(d.RetryAfter, b.Tokens.Wait(tl, tokens))
		}
	default:
		d.OK = true
		if rl > 0 {
			b.Requests.Level -= UnitsPerToken
		}
		if tl > 0 {
			b.Tokens.Level -= tokens * UnitsPerToken
		}
	}
	d.Requests, d.Tokens = bucketsOf(b, rl, tl)
	return b, d
}

// SettleAt is Limiter.Settle over a key's stored buckets at now (Unix
// ms): Reserved − Used goes back to the tokens bucket (negative: is taken
// from it), and RefundRequest gives the request back. The decision is OK
// and carries the buckets after it.
func SettleAt(b Buckets, l policy.Limits, s Settlement, now int64) (Buckets, Decision) {
	rl, tl := effectiveLimit(l.RequestsPerMinute), effectiveLimit(l.TokensPerMinute)
	if rl > 0 {
		b.Requests = Refill(b.Requests, rl, now)
		if s.RefundRequest {
			b.Requests = b.Requests.give(rl, 1)
		}
	}
	if tl > 0 {
		b.Tokens = Refill(b.Tokens, tl, now)
		b.Tokens = b.Tokens.give(tl, max(s.Reserved, 0)-max(s.Used, 0))
	}
	d := Decision{OK: true}
	d.Requests, d.Tokens = bucketsOf(b, rl, tl)
	return b, d
}

func bucketsOf(b Buckets, rl, tl int64) (requests, tokens Bucket) {
	if rl > 0 {
		requests = b.Requests.Bucket(rl)
	}
	if tl > 0 {
		tokens = b.Tokens.Bucket(tl)
	}
	return requests, tokens
}
