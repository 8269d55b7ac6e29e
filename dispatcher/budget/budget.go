package budget

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// ErrExceeded says a charge would take a Budget past its limit.
var ErrExceeded = errors.New("budget: limit exceeded")

// Budget is a limit on the bytes held at once, and the bytes held now.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// New returns an empty Budget of limit bytes; limit must be > 0.
func New(limit int64) (*Budget, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("budget: the limit must be > 0, got %d", limit)
	}
	return &Budget{limit: limit}, nil
}

// Limit is the most bytes the Budget lets be held at once.
func (b *Budget) Limit() int64 { return b.limit }

// Used is the bytes charged now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Fits reports whether n more bytes could be charged now. It reserves
// nothing: a charge made later may still fail.
func (b *Budget) Fits(n int64) bool { return n <= b.limit-b.used.Load() }

// take charges n > 0 bytes unless that would exceed the limit.
func (b *Budget) take(n int64) bool {
	for {
		u := b.used.Load()
		if n > b.limit-u {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Open starts a Charge against b, holding nothing yet.
func (b *Budget) Open() Charge { return Charge{b: b} }

// Charge is the bytes one holder charged to its Budget. The zero Charge
// belongs to no Budget and holds nothing.
type Charge struct {
	b *Budget
	n int64
}

// Grow charges n more bytes; it returns ErrExceeded, charging nothing,
// when they do not fit. Growing by n <= 0 does nothing.
func (c *Charge) Grow(n int64) error {
	if n <= 0 {
		return nil
	}
	if c.b == nil || !c.b.take(n) {
		return ErrExceeded
	}
	c.n += n
	return nil
}

// Bytes is what the charge holds.
func (c *Charge) Bytes() int64 { return c.n }

// Release gives every byte of the charge back. Later calls do nothing
// until it grows again.
func (c *Charge) Release() {
	if c.n > 0 {
		c.b.used.Add(-c.n)
		c.n = 0
	}
}
