package controllers

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// The quota statuses' write delays: after the pool's last batch, and at
// most after the first one still pending.
const (
	quotaQuiet    = time.Second
	quotaMaxDelay = 5 * time.Second
)

// pendingBatch is one pool's latest batch and when it may be written.
type pendingBatch struct {
	write       func(context.Context) error
	first, last time.Time
}

func (p pendingBatch) due() time.Time {
	q, m := p.last.Add(quotaQuiet), p.first.Add(quotaMaxDelay)
	if m.Before(q) {
		return m
	}
	return q
}

// statusBatches writes the pools' TenantQuota statuses off the reconcile
// path. A quota's status carries its share of the pool's concurrency, so
// every change of the slots changes every quota of the pool; written
// inline, 200 quotas held the pool's next reconcile, and so the push of
// the policy a scale-down needs, for seconds (docs/benchmarks.md, cluster
// scale). Here a reconcile hands over its pool's batch and goes on. A
// pool's batch is written once its pool has been quiet for quotaQuiet
// (no newer batch), and at the latest quotaMaxDelay after the first batch
// it replaced: a scale that goes through 30 policy versions in a minute
// writes each quota a few times, not 30. One worker writes the batches in
// turn; a batch replaced before it began is never written.
//
// It is a manager Runnable that runs only on the leader. A batch that
// fails is logged and not retried: the pool's next reconcile (at the
// latest its resync) computes and submits the statuses again.
//
// Concurrency: one mutex guards the pending batches; the worker runs them
// without it, one at a time (each writes its quotas in parallel).
type statusBatches struct {
	log  logr.Logger
	clk  clock.WithTicker
	kick chan struct{}

	mu      sync.Mutex
	pending map[types.NamespacedName]pendingBatch
}

func newStatusBatches(log logr.Logger, clk clock.WithTicker) *statusBatches {
	return &statusBatches{log: log, clk: clk, kick: make(chan struct{}, 1), pending: map[types.NamespacedName]pendingBatch{}}
}

// submit replaces pool's pending batch by write. It never blocks.
func (b *statusBatches) submit(pool types.NamespacedName, write func(context.Context) error) {
	now := b.clk.Now()
	b.mu.Lock()
	p, ok := b.pending[pool]
	if !ok {
		p.first = now
	}
	p.write, p.last = write, now
	b.pending[pool] = p
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// next takes the batch due first if it is due, else says when one will be
// (ok false, zero when none is pending).
func (b *statusBatches) next(now time.Time) (types.NamespacedName, func(context.Context) error, time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var pool types.NamespacedName
	var at time.Time
	for k, p := range b.pending {
		if d := p.due(); at.IsZero() || d.Before(at) {
			pool, at = k, d
		}
	}
	if at.IsZero() || at.After(now) {
		return pool, nil, at, false
	}
	write := b.pending[pool].write
	delete(b.pending, pool)
	return pool, write, at, true
}

// Start runs the worker until ctx ends.
func (b *statusBatches) Start(ctx context.Context) error {
	for {
		pool, write, at, ok := b.next(b.clk.Now())
		if ok {
			if err := write(ctx); err != nil && ctx.Err() == nil {
				b.log.V(1).Info("writing TenantQuota statuses failed; the next reconcile writes them", "pool", pool.String(), "err", err.Error())
			}
			continue
		}
		var timer clock.Timer
		var fire <-chan time.Time
		if !at.IsZero() {
			timer = b.clk.NewTimer(at.Sub(b.clk.Now()))
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-b.kick:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// NeedLeaderElection: only the leader writes status.
func (b *statusBatches) NeedLeaderElection() bool { return true }
