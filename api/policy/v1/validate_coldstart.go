package v1

import "fmt"

// HoldsForColdStart reports whether the policy is that of a pool at zero
// replicas whose first replica is expected after ColdStartSeconds: the
// dispatcher then holds requests within the tiers' bounds, with no slot
// and no backend, and refuses a tier whose QueueBound is 0 at once.
func (p *Policy) HoldsForColdStart() bool {
	return p.Slots == 0 && finite(p.ColdStartSeconds) && p.ColdStartSeconds > 0
}

// coldStart checks ColdStartSeconds. It runs after the other checks: the
// tiers check wants every QueueBound >= 1, which is the rule of a pool
// with slots, and a policy with 0 slots may also carry 0: a pool at zero
// without a cold start refuses every request (its bounds are 0), and one
// that holds for a cold start gives 0 to a tier that cannot be served
// before the first replica is Ready.
func (c *checker) coldStart(p *Policy) {
	switch {
	case !finite(p.ColdStartSeconds) || p.ColdStartSeconds < 0:
		c.add("coldStartSeconds", "must be a finite number >= 0 (0 when the pool is not at zero), got %v", p.ColdStartSeconds)
	case p.ColdStartSeconds > 0 && p.Slots > 0:
		c.add("coldStartSeconds", "is %v but slots is %d; a cold start is only set while the pool is at zero (slots 0)", p.ColdStartSeconds, p.Slots)
	}
	if p.Slots != 0 {
		return
	}
	zero := map[string]bool{}
	for i, t := range p.Tiers {
		if t.QueueBound == 0 {
			zero[fmt.Sprintf("tiers[%d].queueBound", i)] = true
		}
	}
	kept := c.errs[:0]
	for _, e := range c.errs {
		if !zero[e.Field] {
			kept = append(kept, e)
		}
	}
	c.errs = kept
}
