package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/clock"
)

// The status worker's own pace: a burst of statusBurst writes, then one
// every statusWriteEvery (20 a second). The worker shares the manager's
// client, and so its client-side rate limit (--kube-api-qps, 50 a second
// by default, burst 100), with the reconciles: 200 quota writes sent as
// fast as the limiter lets them emptied its bucket, and the next pool
// status write, which a push waits for, queued behind them for up to two
// seconds. At 20 a second the bucket refills faster than the worker takes
// from it.
const (
	statusWriteEvery = 50 * time.Millisecond
	statusBurst      = 10
)

// pacer spaces writes by a token bucket on an injected clock; tokens go
// negative for the writers that wait, so each waits its turn.
//
// Concurrency: safe for concurrent use; wait sleeps without the mutex.
type pacer struct {
	clk   clock.Clock
	every time.Duration
	burst float64

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newPacer(clk clock.Clock, every time.Duration, burst int) *pacer {
	return &pacer{clk: clk, every: every, burst: float64(burst), tokens: float64(burst), last: clk.Now()}
}

// delay takes a token and says how long its holder must wait first.
func (p *pacer) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clk.Now()
	p.tokens = min(p.burst, p.tokens+float64(now.Sub(p.last))/float64(p.every))
	p.last = now
	p.tokens--
	if p.tokens >= 0 {
		return 0
	}
	return time.Duration(-p.tokens * float64(p.every))
}

// wait blocks until its write may go, or ctx ends.
func (p *pacer) wait(ctx context.Context) error {
	d := p.delay()
	if d <= 0 {
		return nil
	}
	t := p.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// before waits its turn (see wait) when a status write from cur to want
// is due; an unchanged status sends nothing, so it does not wait. A nil
// pacer never waits.
func (p *pacer) before(ctx context.Context, cur, want any) error {
	if p == nil || equality.Semantic.DeepEqual(cur, want) {
		return nil
	}
	return p.wait(ctx)
}
