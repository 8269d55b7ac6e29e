package gatetest

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// Fleet is an in-memory fleet-wide store with exact counts and no lease
// expiry: the fake the queue's tests run against, and the reference the
// conformance suite holds the Redis Gate to. Each dispatcher of the fleet
// talks to it through its own Fake.
type Fleet struct {
	mu      sync.Mutex
	next    gate.Lease
	leases  map[gate.Lease]*fakeLease
	counts  map[Count]int
	peaks   map[Count]int
	errs    []string
	failEnq error
	onEnq   func()
	hold    int            // exchanges still to hold
	held    chan *HeldCall // where held exchanges are announced
	calls   map[string]int // Enqueue and Exchange calls
	// With handOff, starved is the dispatchers last refused because the
	// pool was full, by when (a sequence, oldest first), and holds the ones
	// a freed slot is held for; a hold counts as a used slot.
	handOff bool
	starved map[string]int
	holds   map[string]bool
	seq     int
}

type fakeLease struct {
	owner, tenant, tier string
	slot                bool
}

// NewFleet returns an empty fleet.
func NewFleet() *Fleet {
	return &Fleet{
		leases: map[gate.Lease]*fakeLease{}, counts: map[Count]int{}, peaks: map[Count]int{},
		held: make(chan *HeldCall, 1), calls: map[string]int{},
		starved: map[string]int{}, holds: map[string]bool{},
	}
}

// Fake is one dispatcher's gate.Gate on a Fleet.
type Fake struct {
	f    *Fleet
	name string
}

var _ gate.Gate = (*Fake)(nil)

// Gate returns the Gate of the dispatcher called name.
func (f *Fleet) Gate(name string) *Fake { return &Fake{f: f, name: name} }

// HandOff makes the fleet hand the slots a dispatcher frees to the other
// dispatchers starved for the pool, as the Redis Gate does (its
// conformance cases need it). Off by default: a fake has no clock, so its
// holds and starved dispatchers never expire, which a test whose other
// dispatcher is refused once and never claims again does not expect.
func (f *Fleet) HandOff(on bool) {
	f.mu.Lock()
	f.handOff = on
	f.mu.Unlock()
}

// FailEnqueue makes every Enqueue fail with err until it is called with nil.
func (f *Fleet) FailEnqueue(err error) {
	f.mu.Lock()
	f.failEnq = err
	f.mu.Unlock()
}

// OnEnqueue makes every Enqueue call fn first, outside the fleet's lock:
// the test acts while an admission's reservation is in flight. nil stops it.
func (f *Fleet) OnEnqueue(fn func()) {
	f.mu.Lock()
	f.onEnq = fn
	f.mu.Unlock()
}

// HeldCall is an Exchange the fleet holds before deciding it: the test
// acts while the queue's acquire is in flight, then lets it proceed.
type HeldCall struct {
	Claims  int // claims in the exchange
	Returns int // leases it returns
	proceed chan struct{}
}

// Proceed lets the held exchange be decided, by the fleet as it is then.
func (c *HeldCall) Proceed() { close(c.proceed) }

// Hold makes the next n exchanges wait, each announced on Held, until the
// test calls Proceed.
func (f *Fleet) Hold(n int) {
	f.mu.Lock()
	f.hold += n
	f.mu.Unlock()
}

// Held delivers the exchanges held by Hold, one at a time.
func (f *Fleet) Held() <-chan *HeldCall { return f.held }

// Count reads one of the fleet's live counts.
func (f *Fleet) Count(c Count) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[c]
}

// Peak is the highest a count has been.
func (f *Fleet) Peak(c Count) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peaks[c]
}

// Calls is how many calls of a method ("Enqueue", "Exchange") the fleet
// has answered.
func (f *Fleet) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Err returns what the fleet saw go wrong: a lease returned twice or never
// issued, a count below zero, or, once the load stopped, leases still held.
func (f *Fleet) Err(idle bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := append([]string(nil), f.errs...)
	if idle {
		for id, l := range f.leases {
			errs = append(errs, fmt.Sprintf("lease %d of %s (tenant %s, tier %s, slot %v) never returned", id, l.owner, l.tenant, l.tier, l.slot))
		}
		for c, n := range f.counts {
			if n != 0 {
				errs = append(errs, fmt.Sprintf("%v = %d with nothing held", c, n))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(fmt.Sprint(errs))
}

func (f *Fleet) add(c Count, d int) {
	f.counts[c] += d
	if n := f.counts[c]; n < 0 {
		f.errs = append(f.errs, fmt.Sprintf("%v fell to %d", c, n))
	} else if n > f.peaks[c] {
		f.peaks[c] = n
	}
	if f.counts[c] == 0 {
		delete(f.counts, c)
	}
}

// Enqueue implements gate.Gate.
func (g *Fake) Enqueue(tenant, tier string, bound, qlimit int) (gate.Place, error) {
	f := g.f
	f.mu.Lock()
	if fn := f.onEnq; fn != nil {
		f.mu.Unlock()
		fn()
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	f.calls["Enqueue"]++
	if f.failEnq != nil {
		return gate.Place{}, f.failEnq
	}
	n := f.counts[Count{TierQueued, tier}]
	switch {
	case n >= bound:
		return gate.Place{QueuedInTier: n, Result: gate.TierFull}, nil
	case f.counts[Count{TenantQueued, tenant}] >= qlimit:
		return gate.Place{QueuedInTier: n, Result: gate.TenantQueueFull}, nil
	}
	f.next++
	f.leases[f.next] = &fakeLease{owner: g.name, tenant: tenant, tier: tier}
	f.add(Count{TierQueued, tier}, 1)
	f.add(Count{TenantQueued, tenant}, 1)
	return gate.Place{Lease: f.next, QueuedInTier: n + 1, Result: gate.OK}, nil
}

// Exchange implements gate.Gate.
func (g *Fake) Exchange(slots int, returns []gate.Lease, claims []gate.Claim) {
	f := g.f
	f.mu.Lock()
	if f.hold > 0 {
		f.hold--
		c := &HeldCall{Claims: len(claims), Returns: len(returns), proceed: make(chan struct{})}
		f.mu.Unlock()
		f.held <- c
		<-c.proceed
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	f.calls["Exchange"]++
	freed := 0
	for _, id := range returns {
		if f.end(g.name, id) {
			freed++
		}
	}
	if len(claims) > 0 {
		delete(f.holds, g.name) // spent on these claims
	}
	if f.handOff {
		f.give(g.name, slots, freed)
	}
	poolFull := false
	for i := range claims {
		claims[i].Result = f.claim(g.name, slots, claims[i])
		poolFull = poolFull || claims[i].Result == gate.PoolFull
	}
	switch {
	case !f.handOff:
	case poolFull:
		f.seq++
		f.starved[g.name] = f.seq
	case len(claims) > 0:
		delete(f.starved, g.name)
	}
}

// give holds up to freed slots, one each, for the other starved
// dispatchers without a hold, the longest starved first, while a slot is
// free.
func (f *Fleet) give(owner string, slots, freed int) {
	var names []string
	for name := range f.starved {
		if name != owner && !f.holds[name] {
			names = append(names, name)
		}
	}
	sort.Slice(names, func(i, j int) bool { return f.starved[names[i]] < f.starved[names[j]] })
	for _, name := range names {
		if freed == 0 || f.used() >= slots {
			return
		}
		f.holds[name] = true
		freed--
	}
}

// used is the pool's slots taken: in flight or held.
func (f *Fleet) used() int { return f.counts[Count{PoolSlots, ""}] + len(f.holds) }

// end ends one returned lease and reports whether it freed a slot.
func (f *Fleet) end(owner string, id gate.Lease) bool {
	l := f.leases[id]
	switch {
	case l == nil:
		f.errs = append(f.errs, fmt.Sprintf("%s returned lease %d, which it does not hold", owner, id))
		return false
	case l.owner != owner:
		f.errs = append(f.errs, fmt.Sprintf("%s returned lease %d of %s", owner, id, l.owner))
		return false
	}
	delete(f.leases, id)
	if l.slot {
		f.add(Count{PoolSlots, ""}, -1)
		f.add(Count{TenantSlots, l.tenant}, -1)
		return true
	}
	f.add(Count{TierQueued, l.tier}, -1)
	f.add(Count{TenantQueued, l.tenant}, -1)
	return false
}

func (f *Fleet) claim(owner string, slots int, c gate.Claim) gate.Result {
	l := f.leases[c.Lease]
	if l == nil || l.owner != owner || l.slot {
		f.errs = append(f.errs, fmt.Sprintf("%s claimed lease %d, which holds no queued place of its own", owner, c.Lease))
		return gate.PoolFull
	}
	switch {
	case f.used() >= slots:
		return gate.PoolFull
	case f.counts[Count{TenantSlots, l.tenant}] >= c.TenantLimit:
		return gate.TenantFull
	}
	l.slot = true
	f.add(Count{TierQueued, l.tier}, -1)
	f.add(Count{TenantQueued, l.tenant}, -1)
	f.add(Count{PoolSlots, ""}, 1)
	f.add(Count{TenantSlots, l.tenant}, 1)
	return gate.OK
}
