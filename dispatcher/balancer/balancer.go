package balancer

import (
	"net/url"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// Backend is one model replica.
type Backend struct {
	// Address is host:port as in the policy.
	Address string
	// URL is scheme://address, the proxy's target.
	URL         *url.URL
	outstanding atomic.Int64
}

// Outstanding is the number of requests picked and not yet Done.
func (b *Backend) Outstanding() int64 { return b.outstanding.Load() }

// Done ends one request picked for b.
func (b *Backend) Done() { b.outstanding.Add(-1) }

// Balancer holds the current backends.
type Balancer struct {
	mu   sync.Mutex // serialises Update
	set  atomic.Pointer[[]*Backend]
	next atomic.Uint64
}

// New returns a Balancer with no backends.
func New() *Balancer {
	b := &Balancer{}
	b.set.Store(&[]*Backend{})
	return b
}

// Update replaces the backend set.
func (b *Balancer) Update(backends []policy.Backend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := map[string]*Backend{}
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
			continue
		}
		set = append(set, &Backend{Address: pb.Address, URL: u})
	}
	b.set.Store(&set)
}

// Pick returns the backend with the fewest outstanding requests and counts
// one more on it; the caller must call Done once. ok is false when there are
// no backends.
func (b *Balancer) Pick() (be *Backend, ok bool) {
	set := *b.set.Load()
	n := len(set)
	if n == 0 {
		return nil, false
	}
	start := int(b.next.Add(1) % uint64(n))
	best := set[start]
	bestN := best.outstanding.Load()
	for i := 1; i < n && bestN > 0; i++ {
		c := set[(start+i)%n]
		if cn := c.outstanding.Load(); cn < bestN {
			best, bestN = c, cn
		}
	}
	best.outstanding.Add(1)
	return best, true
}

// Load is one backend's outstanding count.
type Load struct {
	Address     string `json:"address"`
	Outstanding int64  `json:"outstanding"`
}

// Snapshot lists the current backends' loads, sorted by address.
func (b *Balancer) Snapshot() []Load {
	set := *b.set.Load()
	out := make([]Load, len(set))
	for i, be := range set {
		out[i] = Load{Address: be.Address, Outstanding: be.outstanding.Load()}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}

// Len is the number of backends.
func (b *Balancer) Len() int { return len(*b.set.Load()) }
