package controllers

import (
	"context"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/clock"
)

// The status worker's own pace: a burst of statusBurst writes, then one
// every statusWriteEvery (40 a second). The worker shares the manager's
// client, and so its client-side rate limit (--kube-api-qps, 50 a second
// by default, burst 100), with the reconciles: 200 quota writes sent as
// fast as the limiter lets them would empty its bucket, and the pool's
// next status write, which a push waits for, would queue behind them for
// up to two seconds. At this pace the default bucket keeps at least 60
// tokens.
const (
	statusWriteEvery = 25 * time.Millisecond
	statusBurst      = 40
)

// pacer spaces writes by a token bucket (golang.org/x/time/rate) read
// on an injected clock; a writer that must wait has reserved its turn.
//
// Concurrency: safe for concurrent use; wait sleeps on its own timer.
type pacer struct {
	clk clock.Clock
	lim *rate.Limiter
}

func newPacer(clk clock.Clock, every time.Duration, burst int) *pacer {
	return &pacer{clk: clk, lim: rate.NewLimiter(rate.Every(every), burst)}
}

// delay reserves a turn and says how long its holder must wait for it.
func (p *pacer) delay() (time.Duration, *rate.Reservation) {
	now := p.clk.Now()
	r := p.lim.ReserveN(now, 1)
	return r.DelayFrom(now), r
}

// wait blocks until its write may go, or ctx ends (and gives its turn
// back).
func (p *pacer) wait(ctx context.Context) error {
	d, r := p.delay()
	if d <= 0 {
		return nil
	}
	t := p.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		r.CancelAt(p.clk.Now())
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
