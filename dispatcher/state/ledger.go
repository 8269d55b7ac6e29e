package state

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

// lease is one lease this dispatcher holds. pool is the pool whose keys
// hold it: a policy may re-point the dispatcher while leases are out.
type lease struct {
	id   string
	pool string
}

type tenantTier struct{ tenant, tier string }

// ledger is what this dispatcher holds, by kind and (tenant, tier), with
// the counts the degraded mode enforces. The leases of one (tenant, tier)
// and kind are interchangeable, so each list is a stack. Not safe for
// concurrent use: the Gate's mutex guards it.
type ledger struct {
	leases      [numKinds]map[tenantTier][]lease
	byID        map[string]kind
	tenantCount [numKinds]map[string]int
	tierQueued  map[string]int
	total       [numKinds]int
}

func newLedger() *ledger {
	l := &ledger{byID: map[string]kind{}, tierQueued: map[string]int{}}
	for k := range numKinds {
		l.leases[k] = map[tenantTier][]lease{}
		l.tenantCount[k] = map[string]int{}
	}
	return l
}

func (l *ledger) push(k kind, tenant, tier string, ls lease) {
	tt := tenantTier{tenant, tier}
	l.leases[k][tt] = append(l.leases[k][tt], ls)
	l.byID[ls.id] = k
	l.tenantCount[k][tenant]++
	l.total[k]++
	if k == kindQueued {
		l.tierQueued[tier]++
	}
}

// pop takes the newest lease of (tenant, tier), if any.
func (l *ledger) pop(k kind, tenant, tier string) (lease, bool) {
	tt := tenantTier{tenant, tier}
	s := l.leases[k][tt]
	if len(s) == 0 {
		return lease{}, false
	}
	ls := s[len(s)-1]
	if len(s) == 1 {
		delete(l.leases[k], tt)
	} else {
		l.leases[k][tt] = s[:len(s)-1]
	}
	delete(l.byID, ls.id)
	dec(l.tenantCount[k], tenant)
	l.total[k]--
	if k == kindQueued {
		dec(l.tierQueued, tier)
	}
	return ls, true
}

func (l *ledger) holds(id string) bool {
	_, ok := l.byID[id]
	return ok
}

func dec(m map[string]int, key string) {
	if m[key] <= 1 {
		delete(m, key)
		return
	}
	m[key]--
}

// slice is this dispatcher's share of pool-wide numbers while Redis is out
// of reach: the same split as local mode (DESIGN.md section 4). The pool's
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
