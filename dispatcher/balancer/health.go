package balancer

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Health configures passive health checking: outlier detection from the
// outcomes of real requests, in the manner of Envoy's consecutive-5xx
// ejection and nginx's max_fails.
type Health struct {
	// FailuresToEject is how many Failed outcomes in a row eject a backend
	// (default 5).
	FailuresToEject int
	// UnreachableToEject is how many Unreachable or Dropped outcomes in a
	// row eject a backend (default 1): a refused connection, or one the
	// backend dropped unanswered, is unambiguous.
	UnreachableToEject int
	// BaseEjection is the first ejection's length; each ejection in a row
	// doubles it, up to MaxEjection (defaults 1s and 30s).
	BaseEjection, MaxEjection time.Duration
}

// Defaults of Health.
const (
	DefaultFailuresToEject    = 5
	DefaultUnreachableToEject = 1
	DefaultBaseEjection       = time.Second
	DefaultMaxEjection        = 30 * time.Second
)

func (h *Health) defaults() {
	if h.FailuresToEject == 0 {
		h.FailuresToEject = DefaultFailuresToEject
	}
	if h.UnreachableToEject == 0 {
		h.UnreachableToEject = DefaultUnreachableToEject
	}
	if h.BaseEjection == 0 {
		h.BaseEjection = DefaultBaseEjection
	}
	if h.MaxEjection == 0 {
		h.MaxEjection = DefaultMaxEjection
	}
}

// Validate refuses negative counts and an ejection range that is upside
// down; zero fields are defaults and fine.
func (h Health) Validate() error {
	var errs []error
	if h.FailuresToEject < 0 || h.UnreachableToEject < 0 {
		errs = append(errs, fmt.Errorf("--backend-eject-after-failures and --backend-eject-after-unreachable must be >= 1, got %d and %d", h.FailuresToEject, h.UnreachableToEject))
	}
	h.defaults()
	if h.BaseEjection < 0 || h.MaxEjection < h.BaseEjection {
		errs = append(errs, fmt.Errorf("--backend-ejection-base %s must be > 0 and at most --backend-ejection-max %s", h.BaseEjection, h.MaxEjection))
	}
	return errors.Join(errs...)
}

// AddFlags registers the --backend-* flags into h.
func AddFlags(fs *flag.FlagSet, h *Health) {
	fs.IntVar(&h.FailuresToEject, "backend-eject-after-failures", DefaultFailuresToEject,
		"a backend that answers 5xx (or breaks a response) this many times in a row is ejected")
	fs.IntVar(&h.UnreachableToEject, "backend-eject-after-unreachable", DefaultUnreachableToEject,
		"a backend whose connection fails (refused, or closed or reset before an answer) this many times in a row is ejected")
	fs.DurationVar(&h.BaseEjection, "backend-ejection-base", DefaultBaseEjection,
		"length of a backend's first ejection; each ejection in a row doubles it")
	fs.DurationVar(&h.MaxEjection, "backend-ejection-max", DefaultMaxEjection, "longest ejection")
}

// Outcome is what one finished request says about its backend.
type Outcome uint8

const (
	// Answered means the backend answered with a status below 500. It is alive.
	Answered Outcome = iota
	// Failed means a 5xx answer, or the backend failed after the request
	// reached it (no answer, or a response cut short).
	Failed
	// Unreachable means the connection to the backend failed, so nothing of the
	// request reached it.
	Unreachable
	// Unknown means the client left first; nothing is learnt.
	Unknown
	// Dropped means the backend's connection closed or reset before it
	// answered, as when its process or host is gone. It counts with
	// Unreachable (a connection failure, as nginx's max_fails counts an
	// error reading the response header), not with Failed: a crashed
	// backend that failed one request ranks last and may never be dialled
	// again, so waiting for a run of them would leave it in service.
	Dropped
)

// Change is what Done did to the backend's health.
type Change struct {
	// Ejected is the length of the ejection Done started; 0 when none.
	Ejected time.Duration
	// Restored is true when a probe's success put the backend back in
	// service.
	Restored bool
	// Spared is true when the backend earned an ejection but is the last
	// one in service, so it stays.
	Spared bool
}

// Done ends one request picked for p with its outcome: the outstanding
// count drops, and the outcome may eject the backend, re-eject it (a
// probe that failed) or restore it (a probe that succeeded).
func (b *Balancer) Done(p Picked, o Outcome) Change {
	be := p.Backend
	be.outstanding.Add(-1)
	switch o {
	case Answered:
		if be.failed.Load() != 0 {
			be.failed.Store(0)
		}
		if be.unreachable.Load() != 0 {
			be.unreachable.Store(0)
		}
		if p.probe || be.ejectedUntil.Load() != 0 {
			return b.restore(be)
		}
		if be.times.Load() != 0 && b.now()-be.restoredAt.Load() >= int64(b.cfg.MaxEjection) {
			be.times.Store(0) // in service long enough: the back-off starts over
		}
	case Failed:
		if n := be.failed.Add(1); p.probe || int(n) >= b.cfg.FailuresToEject {
			return b.eject(be)
		}
	case Unreachable, Dropped:
		if n := be.unreachable.Add(1); p.probe || int(n) >= b.cfg.UnreachableToEject {
			return b.eject(be)
		}
	case Unknown:
		if p.probe {
			be.probing.Store(false) // the next request may probe it
		}
	}
	return Change{}
}

// restore puts a backend on probation back in service.
func (b *Balancer) restore(be *Backend) Change {
	b.mu.Lock()
	defer b.mu.Unlock()
	if be.ejectedUntil.Load() == 0 {
		return Change{}
	}
	be.ejectedUntil.Store(0)
	be.probing.Store(false)
	be.restoredAt.Store(b.now())
	b.countOutLocked()
	return Change{Restored: true}
}

// eject takes be out of service for its back-off, unless it is the last
// backend in service or is out already.
func (b *Balancer) eject(be *Backend) Change {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if until := be.ejectedUntil.Load(); until != 0 && now < until {
		return Change{} // a request picked before the ejection
	}
	if be.ejectedUntil.Load() == 0 && !b.othersInServiceLocked(be) {
		return Change{Spared: true}
	}
	n := be.times.Add(1)
	d := b.cfg.BaseEjection
	for i := int32(1); i < n && d < b.cfg.MaxEjection; i++ {
		d *= 2
	}
	d = min(d, b.cfg.MaxEjection)
	be.ejectedUntil.Store(now + int64(d))
	be.probing.Store(false)
	be.failed.Store(0)
	be.unreachable.Store(0)
	be.ejections.Add(1)
	b.countOutLocked()
	return Change{Ejected: d}
}

// othersInServiceLocked says whether a backend of the set other than be is
// in service.
func (b *Balancer) othersInServiceLocked(be *Backend) bool {
	for _, c := range *b.set.Load() {
		if c != be && c.ejectedUntil.Load() == 0 {
			return true
		}
	}
	return false
}

func (b *Balancer) countOutLocked() {
	var n int32
	for _, c := range *b.set.Load() {
		if c.ejectedUntil.Load() != 0 {
			n++
		}
	}
	b.out.Store(n)
}
