package capacity

import (
	"fmt"
	"strings"
	"time"
)

// HorizonMessage words the ModelPool condition
// AgeingHorizonExceedsClientTimeout; tiergate simulate prints the same
// text, so the two cannot drift.
func HorizonMessage(b PoolBounds) string {
	horizon, rate, points := words(b.AgeingHorizon), words(b.AgeingRate), b.AgeingSpread
	switch {
	case b.ClientTimeout == 0:
		return fmt.Sprintf("ageing horizon %s (%s per point × %d points); no clientTimeout is set", horizon, rate, points)
	case b.HorizonExceedsClientTimeout:
		return fmt.Sprintf("ageing horizon %s (%s per point × %d points) exceeds clientTimeout %s: under sustained load of the top tier a request of the lowest tier expires before ageing lifts it, so the starvation guarantee is void",
			horizon, rate, points, words(b.ClientTimeout))
	default:
		return fmt.Sprintf("ageing horizon %s (%s per point × %d points) is within clientTimeout %s", horizon, rate, points, words(b.ClientTimeout))
	}
}

// words is d for a message; a saturated duration is said as such rather
// than as 2562047h47m16.854775807s.
func words(d time.Duration) string {
	if d == maxDuration {
		return "more than 292 years"
	}
	return d.String()
}

// guarantee says MaxWait in words, with the conditions under which it holds.
// behind is the ageing behind the top tier and drain the time to drain
// the pool's queues; MaxWait is their sum plus the cold start (while held)
// and one service time.
func guarantee(t TierBounds, pool PoolBounds, topTier string, behind, drain time.Duration, top bool) string {
	switch {
	case t.Unbounded && pool.ColdStart > 0:
		return fmt.Sprintf("No %s request is held while the pool is at zero replicas: after the cold start of %s its tolerable wait of %s leaves the first replica no time to serve one (bound 0), so it is refused at once until a replica is Ready.",
			t.Name, pool.ColdStart, effectiveWait(t.TolerableWait, pool.ClientTimeout))
	case t.Unbounded:
		return fmt.Sprintf("No wait is guaranteed for tier %s: the pool has no ready replicas, so nothing is served.", t.Name)
	}
	var b strings.Builder
	rate := pool.ServiceRateString
	if pool.ColdStart > 0 {
		rate = pool.FirstReplicaRateString
		fmt.Fprintf(&b, "While the pool is at zero replicas a %s request whose tenant is under its own limits is held and waits at most %s: %s of cold start until the first replica is Ready, then",
			t.Name, words(t.MaxWait), pool.ColdStart)
	} else {
		fmt.Fprintf(&b, "Under sustained overload a %s request whose tenant is under its own limits waits at most %s:", t.Name, words(t.MaxWait))
	}
	fmt.Fprintf(&b, " %s of ageing behind %s work, %s to drain at most %d queued requests at %s req/s, and one service time of %s.",
		words(behind), topTier, words(drain), pool.TotalQueueBound, rate, words(pool.ServiceTime))
	if top {
		b.WriteString(" Older lower-tier requests that have aged past it may be served first; that cost is inside this bound.")
	}
	b.WriteString(" A tenant at its own limit also waits for its own earlier requests.")
	if t.MaxWaitExceedsClientTimeout {
		fmt.Fprintf(&b, " This exceeds the client timeout of %s, so under sustained overload such a request may expire instead of being served.", words(pool.ClientTimeout))
	}
	return b.String()
}

// effectiveWait words min(W, clientTimeout).
func effectiveWait(w, clientTimeout time.Duration) string {
	if clientTimeout > 0 && clientTimeout < w {
		return fmt.Sprintf("%s (the client timeout; the tier's own is %s)", clientTimeout, w)
	}
	return w.String()
}
