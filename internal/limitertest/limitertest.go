package limitertest

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// Store is one fresh, empty store of budgets for one case.
type Store struct {
	// Limiters are n Limiters that keep their buckets in this store, as
	// the dispatchers of one pool do (the same Limiter n times is fine for
	// a store in memory).
	Limiters []tokens.Limiter
	// Sleep lets d pass on the store's clock: a fake clock steps, a real
	// one sleeps. The fleet case calls it from a goroutine of its own.
	Sleep func(d time.Duration)
	// Now reads the store's clock; only the case's goroutine calls it.
	Now func() time.Time
}

// Harness adapts a Limiter implementation to the suite.
type Harness struct {
	// New makes a fresh store with n >= 1 Limiters for one case.
	New func(t *testing.T, n int) Store
	// Slack bounds the store time a case's calls take beyond what it lets
	// pass with Sleep: 0 for a fake clock; for a real one, more than the
	// slowest case's calls take together. Levels may be up to the refill
	// of Slack higher, and waits and resets up to Slack shorter, than
	// without it. Cases that must see a refusal keep their refills well
	// above it.
	Slack time.Duration
}

// Run runs every case against h.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name      string
		limiters  int
		run       func(s *suite)
		wantSlack time.Duration // the case needs Slack below this
	}{
		{"a new bucket is full", 1, caseNewBucketIsFull, time.Second},
		{"both buckets or neither", 1, caseBothOrNeither, time.Second},
		{"refusals name the budget and the wait", 1, caseRefusals, 250 * time.Millisecond},
		{"the requests budget refuses first", 1, caseRequestsFirst, time.Second},
		{"a reservation over the whole limit is never", 1, caseNever, time.Second},
		{"settle gives back and takes", 1, caseSettle, time.Second},
		{"settle refunds the request", 1, caseRefundRequest, time.Second},
		{"negative counts count as 0", 1, caseNegativeCounts, time.Second},
		{"a lowered limit caps the level", 1, caseLoweredLimit, time.Second},
		{"no budget, or only one", 1, caseNoBudget, time.Second},
		{"remaining and reset", 1, caseHeaderValues, 500 * time.Millisecond},
		{"keys are independent", 1, caseIndependentKeys, time.Second},
		{"limiters of one store share its buckets", 3, caseShared, time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if h.Slack >= c.wantSlack {
				t.Fatalf("the harness's Slack %s is too long for this case (it must be under %s)", h.Slack, c.wantSlack)
			}
			st := h.New(t, c.limiters)
			c.run(&suite{t: t, h: h, st: st})
		})
	}
	t.Run("the fleet never admits more than the budget", func(t *testing.T) {
		for _, k := range []int{1, 2, 3} {
			t.Run(limitersName(k), func(t *testing.T) {
				caseFleet(t, h.New(t, k), k)
			})
		}
	})
}

type suite struct {
	t  *testing.T
	h  Harness
	st Store
}

// lim is the i-th Limiter of the case's store.
func (s *suite) lim(i int) tokens.Limiter { return s.st.Limiters[i] }

// reserve calls Reserve on the first Limiter and fails the case on error.
func (s *suite) reserve(k tokens.Key, l policy.Limits, n int64) tokens.Decision {
	s.t.Helper()
	return s.reserveOn(0, k, l, n)
}

func (s *suite) reserveOn(i int, k tokens.Key, l policy.Limits, n int64) tokens.Decision {
	s.t.Helper()
	d, err := s.lim(i).Reserve(context.Background(), k, l, n)
	if err != nil {
		s.t.Fatalf("Reserve(%+v, %+v, %d): %v", k, l, n, err)
	}
	return d
}

func (s *suite) settle(k tokens.Key, l policy.Limits, st tokens.Settlement) tokens.Decision {
	s.t.Helper()
	return s.settleOn(0, k, l, st)
}

// settleOn calls Settle on the i-th Limiter and checks it did not refuse.
func (s *suite) settleOn(i int, k tokens.Key, l policy.Limits, st tokens.Settlement) tokens.Decision {
	s.t.Helper()
	d, err := s.lim(i).Settle(context.Background(), k, l, st)
	if err != nil {
		s.t.Fatalf("Settle(%+v, %+v, %+v): %v", k, l, st, err)
	}
	if !d.OK || d.Budget != "" || d.Never || d.RetryAfter != 0 {
		s.t.Errorf("Settle(%+v, %+v, %+v) = %+v: a settlement never refuses", k, l, st, d)
	}
	return d
}

// ok checks that d admitted.
func (s *suite) ok(what string, d tokens.Decision) {
	s.t.Helper()
	if !d.OK || d.Budget != "" || d.Never || d.RetryAfter != 0 {
		s.t.Fatalf("%s: %+v, want OK (no budget, never or wait)", what, d)
	}
}

// refused checks that d refused by budget, Never or not, and, unless
// Never, that RetryAfter is the time the bucket of that level and limit
// takes to hold need.
func (s *suite) refused(what string, d tokens.Decision, budget string, never bool, limit int64, level, need float64) {
	s.t.Helper()
	if d.OK || d.Budget != budget || d.Never != never {
		s.t.Fatalf("%s: %+v, want refused by the %s budget with Never %v", what, d, budget, never)
	}
	if never {
		if d.RetryAfter != 0 {
			s.t.Errorf("%s: RetryAfter %s with Never, want 0", what, d.RetryAfter)
		}
		return
	}
	lo, hi := s.wait(limit, s.high(limit, level), need), s.wait(limit, level, need)
	lo, hi = max(lo, time.Millisecond), max(hi, time.Millisecond)+time.Millisecond
	if d.RetryAfter < lo || d.RetryAfter > hi {
		s.t.Errorf("%s: RetryAfter %s, want %s to %s (level %g of %d, need %g)", what, d.RetryAfter, lo, hi, level, limit, need)
	}
}

// bucket checks a bucket of the given limit whose level was level when the
// call was made, had no more store time passed than the case let pass.
func (s *suite) bucket(what string, got tokens.Bucket, limit int64, level float64) {
	s.t.Helper()
	if limit == 0 {
		if got != (tokens.Bucket{}) {
			s.t.Errorf("%s: %+v, want the zero Bucket (no such budget)", what, got)
		}
		return
	}
	hiLevel := s.high(limit, level)
	remLo, remHi := remaining(level), remaining(hiLevel)
	resetLo, resetHi := s.wait(limit, hiLevel, float64(limit)), s.wait(limit, level, float64(limit))
	if level < float64(limit) {
		resetHi += time.Millisecond // rounding up is fine, down is not
	}
	if got.Limit != limit || got.Remaining < remLo || got.Remaining > remHi || got.Reset < resetLo || got.Reset > resetHi {
		s.t.Errorf("%s: %+v, want Limit %d, Remaining %d to %d, Reset %s to %s (level %g)",
			what, got, limit, remLo, remHi, resetLo, resetHi, level)
	}
}

// high is the highest level a bucket at level may show after the Slack.
func (s *suite) high(limit int64, level float64) float64 {
	return math.Min(float64(limit), level+rate(limit)*s.h.Slack.Seconds())
}

// wait is the exact time a bucket of limit at level takes to hold need.
func (s *suite) wait(limit int64, level, need float64) time.Duration {
	if level >= need {
		return 0
	}
	return time.Duration((need - level) * float64(tokens.Window) / float64(limit))
}

// rate is a limit's refill per second.
func rate(limit int64) float64 { return float64(limit) / tokens.Window.Seconds() }

func remaining(level float64) int64 { return max(0, int64(math.Floor(level))) }

func limitersName(k int) string {
	if k == 1 {
		return "1 limiter"
	}
	return strconv.Itoa(k) + " limiters"
}
