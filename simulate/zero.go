package simulate

import (
	"fmt"
	"strings"
	"time"

	"github.com/tiergate/tiergate/capacity"
)

// A pool at zero replicas with spec.coldStart holds requests for its first
// replica: the controller's bounds at zero (capacity), pushed with 0 slots,
// and the real queue holding within them. The Load's replicaChanges say
// when that replica is Ready; the figures below count what was held
// meanwhile and compare its waits with the stated maxWait at zero.

// noteHeldBounds records each tier's stated maxWait at zero, b being the
// pool-wide bounds of a held policy.
func (e *engine) noteHeldBounds(b capacity.Bounds) {
	for _, tb := range b.Tiers {
		ts := e.tiers[tb.Name]
		if ts == nil {
			continue
		}
		if ts.res.HeldAtZero == nil {
			ts.res.HeldAtZero = &HeldFigures{}
		}
		ts.heldStated = 0
		if !tb.Unbounded {
			ts.heldStated = tb.MaxWait
		}
		ts.res.HeldAtZero.StatedMaxWait = round6(ts.heldStated.Seconds())
	}
}

// heldCount adds to the held figures of r's tier, in the window.
func (e *engine) heldCount(r *request, add func(*HeldFigures)) {
	if h := r.ten.tier.res.HeldAtZero; h != nil && e.inWindow() {
		add(h)
	}
}

// admittedAtZero marks r, just admitted, as held when the pool is at zero.
func (e *engine) admittedAtZero(r *request) {
	r.heldAtZero = e.held != nil
	if r.heldAtZero {
		e.heldCount(r, func(h *HeldFigures) { h.Held++ })
	}
}

// heldDispatched counts a held request's dispatch and its wait.
func (e *engine) heldDispatched(r *request, waited time.Duration) {
	e.heldCount(r, func(h *HeldFigures) {
		h.Dispatched++
		r.ten.tier.heldMax = max(r.ten.tier.heldMax, waited)
	})
}

// finishHeld sets the held figures' longest wait and its verdict.
func (ts *tierState) finishHeld() {
	if h := ts.res.HeldAtZero; h != nil {
		h.MaxWait = round6(ts.heldMax.Seconds())
		h.WithinMaxWait = h.Dispatched == 0 || (ts.heldStated > 0 && ts.heldMax <= ts.heldStated)
	}
}

// zeroWarnings say what each scale to zero does: without a cold start
// every request is refused; with one, requests are held within the bounds
// at zero and the tiers that cannot wait it out are refused, and a pool
// left at zero longer than the cold start keeps its held requests waiting
// longer than those bounds assume.
func (e *engine) zeroWarnings() []string {
	var out []string
	changes := e.load.ReplicaChanges
	cold := e.first.Pool.ColdStart
	if cs := e.in.Pool.Spec.ColdStart; cs != nil {
		cold = cs.Duration
	}
	stated := false
	for i, c := range changes {
		if c.Replicas != 0 {
			continue
		}
		prefix := fmt.Sprintf("replicaChanges[%d]: the pool scales to 0 at %s: ", i, c.At.Duration)
		if cold <= 0 {
			out = append(out, prefix+"requests are refused with 503 unavailable until it scales up")
			continue
		}
		words, late := e.heldWords(cold)
		out = append(out, prefix+words)
		if !stated {
			out, stated = append(out, late...), true
		}
		until, back := e.duration, "the end of the run"
		for _, n := range changes[i+1:] {
			if n.Replicas > 0 {
				until, back = n.At.Duration, fmt.Sprintf("its first replica at %s", n.At.Duration)
				break
			}
		}
		if stay := until - c.At.Duration; stay > cold {
			out = append(out, fmt.Sprintf("replicaChanges[%d]: the pool stays at zero for %s (until %s), longer than its coldStart %s: requests held early wait longer than the bounds at zero assume and may expire",
				i, stay, back, cold))
		}
	}
	return out
}

// heldWords describes the bounds at zero with a cold start, and warns of
// the tiers whose maxWait at zero exceeds the client timeout.
func (e *engine) heldWords(cold time.Duration) (string, []string) {
	b, err := e.computeBounds(0, 1)
	if err != nil {
		return err.Error(), nil
	}
	var held, refused, late []string
	for _, tb := range b.Tiers {
		if tb.QueueBound == 0 {
			refused = append(refused, tb.Name)
			continue
		}
		held = append(held, fmt.Sprintf("%s %d", tb.Name, tb.QueueBound))
		if tb.MaxWaitExceedsClientTimeout {
			late = append(late, fmt.Sprintf("tier %s: the stated maxWait at zero %s exceeds clientTimeout %s: a request held for the first replica may expire before it is served",
				tb.Name, tb.MaxWait, b.Pool.ClientTimeout))
		}
	}
	var w strings.Builder
	if len(held) > 0 {
		fmt.Fprintf(&w, "with coldStart %s requests are held for the first replica within the bounds at zero (%s)", cold, strings.Join(held, ", "))
	} else {
		fmt.Fprintf(&w, "with coldStart %s no tier can wait out the cold start, so nothing is held", cold)
	}
	if len(refused) > 0 {
		fmt.Fprintf(&w, "; %s cannot wait out the cold start and %s refused at once with 503 unavailable (Retry-After %s)",
			strings.Join(refused, ", "), map[bool]string{true: "is", false: "are"}[len(refused) == 1], cold)
	}
	return w.String(), late
}
