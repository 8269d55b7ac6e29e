package tokens

import (
	"context"
	"sync"

	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Local keeps the budgets in this process: a map of each key's buckets
// under one mutex, the maths of ReserveAt and SettleAt. It never fails.
//
// Idle keys are forgotten without a goroutine: the map is two
// generations, each IdleMillis long. A key used moves to the current one;
// when a generation ends the previous one is dropped whole, so a key goes
// once it has been idle for at least IdleMillis, when its buckets are full
// and forgetting them changes nothing. Each call does O(1) work for it.
type Local struct {
	clk clock.PassiveClock

	mu       sync.Mutex
	cur, old map[Key]*Buckets
	// rotateAt is when the current generation ends, Unix ms.
	rotateAt int64
}

var _ Limiter = (*Local)(nil)

// NewLocal is a Local on clk.
func NewLocal(clk clock.PassiveClock) *Local {
	return &Local{
		clk:      clk,
		cur:      map[Key]*Buckets{},
		old:      map[Key]*Buckets{},
		rotateAt: clk.Now().UnixMilli() + IdleMillis,
	}
}

// Reserve implements Limiter.
func (l *Local) Reserve(_ context.Context, k Key, lim policy.Limits, tokens int64) (Decision, error) {
	if !hasBudget(lim) {
		return Decision{OK: true}, nil
	}
	now := l.clk.Now().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets(k, now)
	var d Decision
	*b, d = ReserveAt(*b, lim, tokens, now)
	return d, nil
}

// Settle implements Limiter.
func (l *Local) Settle(_ context.Context, k Key, lim policy.Limits, s Settlement) (Decision, error) {
	if !hasBudget(lim) {
		return Decision{OK: true}, nil
	}
	now := l.clk.Now().UnixMilli()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets(k, now)
	var d Decision
	*b, d = SettleAt(*b, lim, s, now)
	return d, nil
}

func hasBudget(l policy.Limits) bool {
	return effectiveLimit(l.RequestsPerMinute) > 0 || effectiveLimit(l.TokensPerMinute) > 0
}

// buckets is k's buckets, new (zero, full) when k is unknown. l.mu is
// held.
func (l *Local) buckets(k Key, now int64) *Buckets {
	l.rotate(now)
	if b, ok := l.cur[k]; ok {
		return b
	}
	b, ok := l.old[k]
	if ok {
		delete(l.old, k)
	} else {
		b = &Buckets{}
	}
	l.cur[k] = b
	return b
}

// rotate ends the current generation when its time has come. Every call
// so far came before rotateAt, so a key of the previous generation has
// been idle for at least IdleMillis; if a whole generation passed with no
// call, so has every key of the current one.
func (l *Local) rotate(now int64) {
	if now < l.rotateAt {
		return
	}
	if now-l.rotateAt >= IdleMillis {
		l.old = map[Key]*Buckets{}
	} else {
		l.old = l.cur
	}
	l.cur = make(map[Key]*Buckets, len(l.old))
	l.rotateAt = now + IdleMillis
}

// size is the keys l remembers, for the tests of forgetting.
func (l *Local) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.cur) + len(l.old)
}
