package fleet

import (
	"strconv"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// kind is what a lease holds.
type kind uint8

const (
	kindQueued kind = iota // a place in a tier queue
	kindSlot               // an in-flight slot
	numKinds
)

func (k kind) String() string {
	if k == kindSlot {
		return "slot"
	}
	return "queued"
}

// lease is one lease this dispatcher holds: its member in Redis's sets,
// the pool whose keys hold it (a policy may re-point the dispatcher while
// leases are out), the tenant and tier it counts for, and what it holds.
type lease struct {
	member       string
	pool         string
	tenant, tier string
	kind         kind
	// claiming: an exchange is turning its queued place into a slot, so a
	// renewal that finds the place gone must not write it back.
	claiming bool
}

// ledger is what this dispatcher holds, with the counts the degraded mode
// enforces. Not safe for concurrent use: the Gate's mutex guards it.
type ledger struct {
	leases      map[gate.Lease]*lease
	tenantCount [numKinds]map[string]int
	tierQueued  map[string]int
	total       [numKinds]int
}

func newLedger() *ledger {
	l := &ledger{leases: map[gate.Lease]*lease{}, tierQueued: map[string]int{}}
	for k := range numKinds {
		l.tenantCount[k] = map[string]int{}
	}
	return l
}

// memberOf is the sorted-set member of lease n of dispatcher id.
func memberOf(id string, n gate.Lease) string {
	return id + ":" + strconv.FormatUint(uint64(n), 36)
}

func (l *ledger) add(n gate.Lease, ls *lease) {
	l.leases[n] = ls
	l.count(ls, 1)
}

func (l *ledger) count(ls *lease, d int) {
	l.tenantCount[ls.kind][ls.tenant] += d
	if l.tenantCount[ls.kind][ls.tenant] <= 0 {
		delete(l.tenantCount[ls.kind], ls.tenant)
	}
	l.total[ls.kind] += d
	if ls.kind == kindQueued {
		l.tierQueued[ls.tier] += d
		if l.tierQueued[ls.tier] <= 0 {
			delete(l.tierQueued, ls.tier)
		}
	}
}

// remove forgets lease n and returns it, if held.
func (l *ledger) remove(n gate.Lease) (*lease, bool) {
	ls, ok := l.leases[n]
	if !ok {
		return nil, false
	}
	delete(l.leases, n)
	l.count(ls, -1)
	return ls, true
}

// grant turns a held queued place into a slot under pool.
func (l *ledger) grant(ls *lease, pool string) {
	l.count(ls, -1)
	ls.kind, ls.pool = kindSlot, pool
	l.count(ls, 1)
}

// slice is this dispatcher's share of pool-wide numbers while Redis is out
// of reach: the same split as local mode (docs/architecture.md#the-bounds). The pool's
// slots are divided as evenly as whole numbers allow among the dispatchers
// Redis last listed, lower ranks taking the remainder, so the slices sum to
// the pool; every other number is scaled by the slot fraction. Nothing
// drops below 1, so every dispatcher keeps serving: a number smaller than
// the fleet can be exceeded by at most (dispatchers - 1) during an outage.
type slice struct {
	slots int // this dispatcher's slots
	pool  int // the pool's slots
}

func sliceOf(poolSlots, dispatchers, rank int) slice {
	if dispatchers < 1 {
		dispatchers = 1
	}
	if poolSlots <= 0 {
		return slice{slots: 0, pool: 0}
	}
	s := poolSlots / dispatchers
	if rank < poolSlots%dispatchers {
		s++
	}
	return slice{slots: max(1, s), pool: poolSlots}
}

// scale is n (a pool-wide bound or limit) times the slot fraction, never
// below 1.
func (s slice) scale(n int) int {
	if s.pool <= 0 {
		return max(1, n)
	}
	return max(1, n*s.slots/s.pool)
}
