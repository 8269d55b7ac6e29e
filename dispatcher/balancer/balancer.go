package balancer

import (
	"net/url"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Backend is one model replica.
type Backend struct {
	// Address is host:port as in the policy.
	Address string
	// URL is scheme://address, the proxy's target.
	URL         *url.URL
	outstanding atomic.Int64

	// Passive health. The atomics are read by Pick without a lock; the
	// transitions (eject, probe, restore) happen under Balancer.mu.
	failed       atomic.Int32 // consecutive Failed outcomes
	unreachable  atomic.Int32 // consecutive Unreachable outcomes
	ejectedUntil atomic.Int64 // clock ns since the epoch; 0 while in service
	probing      atomic.Bool  // the one request of a half-open backend is out
	ejections    atomic.Uint64
	times        atomic.Int32 // ejections in a row, for the back-off
	restoredAt   atomic.Int64 // when the last probe restored it
}

// Outstanding is the number of requests picked and not yet Done.
func (b *Backend) Outstanding() int64 { return b.outstanding.Load() }

// Ejections counts the backend's ejections so far.
func (b *Backend) Ejections() uint64 { return b.ejections.Load() }

// Picked is one Pick: the backend, and whether the request is the probe
// of a backend whose ejection ended.
type Picked struct {
	*Backend
	probe bool
}

// Balancer holds the current backends.
type Balancer struct {
	cfg   Health
	clk   clock.PassiveClock
	epoch time.Time

	mu   sync.Mutex // serialises Update and the health transitions
	set  atomic.Pointer[[]*Backend]
	gone map[string]*Backend // removed backends still running requests, by URL
	next atomic.Uint64
	// out counts the backends of the set out of service, so Pick reads the
	// clock only when one is.
	out atomic.Int32
}

// New returns a Balancer with no backends. Zero fields of h take their
// defaults; clk nil is the real clock.
func New(h Health, clk clock.PassiveClock) *Balancer {
	h.defaults()
	if clk == nil {
		clk = clock.RealClock{}
	}
	b := &Balancer{cfg: h, clk: clk, epoch: clk.Now(), gone: map[string]*Backend{}}
	b.set.Store(&[]*Backend{})
	return b
}

func (b *Balancer) now() int64 { return int64(b.clk.Since(b.epoch)) }

// Update replaces the backend set. A backend that stays (same address and
// scheme) keeps its counts and health; one that is removed while it still
// runs requests keeps them too, should it come back before they end.
func (b *Balancer) Update(backends []policy.Backend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.gone
	for _, be := range *b.set.Load() {
		old[be.URL.String()] = be
	}
	set := make([]*Backend, 0, len(backends))
	for _, pb := range backends {
		scheme := pb.Scheme
		if scheme == "" {
			scheme = "http"
		}
		u := &url.URL{Scheme: scheme, Host: pb.Address}
		if be, ok := old[u.String()]; ok {
			set = append(set, be)
			delete(old, u.String())
			continue
		}
		set = append(set, &Backend{Address: pb.Address, URL: u})
	}
	b.gone = map[string]*Backend{}
	for k, be := range old {
		if be.outstanding.Load() > 0 {
			b.gone[k] = be
		}
	}
	b.set.Store(&set)
	b.countOutLocked()
}

// Pick returns the backend in service with the lowest score (outstanding
// requests plus consecutive failures, ties round-robin) and counts one
// more request on it; the caller must call Done once with the result.
// exclude, when not nil, is never picked (the backend a retry leaves). A
// backend whose ejection has ended is picked for one probe request while
// none is out. When every candidate is ejected, the one whose ejection
// ends first is picked. ok is false when there is no candidate.
func (b *Balancer) Pick(exclude *Backend) (p Picked, ok bool) {
	set := *b.set.Load()
	var now int64
	if b.out.Load() > 0 {
		now = b.now()
	}
	var skip *Backend
	for range 2 {
		be := b.scan(set, exclude, skip, now)
		if be == nil {
			break
		}
		if be.ejectedUntil.Load() == 0 {
			be.outstanding.Add(1)
			return Picked{Backend: be}, true
		}
		if be.probing.CompareAndSwap(false, true) {
			be.outstanding.Add(1)
			return Picked{Backend: be, probe: true}, true
		}
		skip = be // another request took the probe meanwhile
	}
	be := leastBad(set, exclude)
	if be == nil {
		return Picked{}, false
	}
	be.outstanding.Add(1)
	return Picked{Backend: be}, true
}

// scan is the best candidate in service or due for its probe.
func (b *Balancer) scan(set []*Backend, exclude, skip *Backend, now int64) *Backend {
	n := len(set)
	if n == 0 {
		return nil
	}
	start := int(b.next.Add(1) % uint64(n))
	var best *Backend
	var bestScore int64
	for i := range n {
		c := set[(start+i)%n]
		if c == exclude || c == skip {
			continue
		}
		if until := c.ejectedUntil.Load(); until != 0 && (now < until || c.probing.Load()) {
			continue
		}
		score := c.outstanding.Load() + int64(c.failed.Load()) + int64(c.unreachable.Load())
		if best == nil || score < bestScore {
			best, bestScore = c, score
		}
	}
	return best
}

// leastBad is the candidate whose ejection ends first, fewer outstanding
// requests breaking ties.
func leastBad(set []*Backend, exclude *Backend) *Backend {
	var best *Backend
	for _, c := range set {
		if c == exclude {
			continue
		}
		if best == nil || c.ejectedUntil.Load() < best.ejectedUntil.Load() ||
			(c.ejectedUntil.Load() == best.ejectedUntil.Load() && c.outstanding.Load() < best.outstanding.Load()) {
			best = c
		}
	}
	return best
}

// Load is one backend's state.
type Load struct {
	Address     string `json:"address"`
	Outstanding int64  `json:"outstanding"`
	// Ejected is true from an ejection until a probe succeeds.
	Ejected bool `json:"ejected"`
	// Ejections counts this backend's ejections.
	Ejections uint64 `json:"ejections"`
	// Failures is the current run of failed or unreachable outcomes.
	Failures int `json:"failures"`
}

// Snapshot lists the current backends' loads, sorted by address.
func (b *Balancer) Snapshot() []Load {
	set := *b.set.Load()
	out := make([]Load, len(set))
	for i, be := range set {
		out[i] = Load{
			Address: be.Address, Outstanding: be.outstanding.Load(), Ejected: be.ejectedUntil.Load() != 0,
			Ejections: be.ejections.Load(), Failures: int(be.failed.Load() + be.unreachable.Load()),
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}

// Len is the number of backends.
func (b *Balancer) Len() int { return len(*b.set.Load()) }
