package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// The status batches' write delays (docs/architecture.md, "status for
// people"). A settled pool's batch is written once the pool has been quiet
// for statusQuiet; a moving pool's (replicas on their way, see
// replicasMoving) once it has been quiet for movingQuiet. Either is
// written at the latest statusMaxStale after the first batch still
// pending, which bounds how stale a quota's status can be.
const (
	statusQuiet    = time.Second
	movingQuiet    = 10 * time.Second
	statusMaxStale = time.Minute
)

// statusBatch is one pool's statuses to write: write does it, settled
// says whether the pool's replicas had settled when it was computed, and
// content is what it writes. A batch whose content and settledness equal
// the pending one's does not restart the quiet period: resyncs and acks
// reconcile a pool every few hundred milliseconds without a change.
type statusBatch struct {
	write   func(context.Context) error
	settled bool
	content any
}

// pendingBatch is one pool's latest batch and when it may be written.
type pendingBatch struct {
	statusBatch
	first, last time.Time
}

// due is when the pending batch is written.
func (p pendingBatch) due() time.Time {
	quiet := movingQuiet
	if p.settled {
		quiet = statusQuiet
	}
	q, m := p.last.Add(quiet), p.first.Add(statusMaxStale)
	if m.Before(q) {
		return m
	}
	return q
}

// statusBatches writes the pools' TenantQuota statuses, and a moving
// pool's ServiceTier statuses, off the reconcile path. A quota's status
// carries its share of the pool's concurrency, so every change of the
// slots changes every quota of the pool; written inline, 200 quotas held
// the pool's next reconcile, and so the push of the policy a scale-down
// needs, for seconds; written every 5 s, a scale-up of 500 pods that goes
// through 28 policy versions in 24 s wrote each quota 4-5 times
// (docs/benchmarks.md, cluster scale). Here a reconcile hands over its
// pool's batch and goes on; the batch is written once the change is over
// (see pendingBatch.due), so each quota is written about once a change. One
// worker writes the batches in turn, at its own pace (statuspace.go), so
// that it leaves the client's rate limit to the pushes; a batch replaced
// before it began is never written.
//
// It is a manager Runnable that runs only on the leader. A batch that
// fails is logged and not retried: the pool's next reconcile (at the
// latest its resync) computes and submits the statuses again.
//
// Concurrency: one mutex guards the pending batches; the worker runs them
// without it, one at a time (each writes its objects in parallel).
type statusBatches struct {
	log  logr.Logger
	clk  clock.WithTicker
	kick chan struct{}

	// pace spaces the batches' writes (statuspace.go).
	pace *pacer

	mu      sync.Mutex
	pending map[types.NamespacedName]pendingBatch
}

func newStatusBatches(log logr.Logger, clk clock.WithTicker) *statusBatches {
	return &statusBatches{log: log, clk: clk, kick: make(chan struct{}, 1), pace: newPacer(clk, statusWriteEvery, statusBurst),
		pending: map[types.NamespacedName]pendingBatch{}}
}

// submit replaces pool's pending batch by b. It never blocks.
func (b *statusBatches) submit(pool types.NamespacedName, batch statusBatch) {
	now := b.clk.Now()
	b.mu.Lock()
	p, ok := b.pending[pool]
	switch {
	case !ok:
		p.first, p.last = now, now
	case p.settled != batch.settled || !equality.Semantic.DeepEqual(p.content, batch.content):
		p.last = now
	}
	p.statusBatch = batch
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
				b.log.V(1).Info("writing the tiers' and quotas' statuses failed; the next reconcile writes them", "pool", pool.String(), "err", err.Error())
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

// submitStatus writes the statuses for people after a reconcile's push:
// the pool's ScaledPool event, the tiers' statuses and the quotas'. A
// settled pool's tiers are written at once (three or so writes, and their
// ScaledBounds event) by the tier writer (latestwrite.go); a moving
// pool's wait with its quotas for the change to settle. Without the
// writers (unit tests) everything is written inline.
func (r *PoolReconciler) submitStatus(ctx context.Context, pool *v1alpha1.ModelPool, obs *observed, bounds capacity.Bounds, stamp metav1.Time, mem *statusMemory) error {
	moving := replicasMoving(obs.deployment, len(obs.backends))
	r.scaledPool(pool, bounds.Pool, moving, mem)
	tiers, quotas := tierWants(obs, bounds, stamp), quotaWants(pool, obs, bounds, stamp)
	if r.quotaStatus == nil {
		if err := r.writeTierStatus(ctx, pool, obs, tiers, bounds, nil); err != nil {
			return err
		}
		return r.writeQuotaStatus(ctx, obs, quotas, nil)
	}
	key, pace := client.ObjectKeyFromObject(pool), r.quotaStatus.pace
	if moving {
		r.quotaStatus.submit(key, statusBatch{content: [2]any{unstampedTiers(tiers), unstampedQuotas(quotas)}, write: func(ctx context.Context) error {
			return errors.Join(r.writeTierStatus(ctx, pool, obs, tiers, bounds, pace), r.writeQuotaStatus(ctx, obs, quotas, pace))
		}})
		return nil
	}
	if r.tierStatus != nil {
		r.tierStatus.submit(key, func(ctx context.Context) error { return r.writeTierStatus(ctx, pool, obs, tiers, bounds, nil) })
	} else if err := r.writeTierStatus(ctx, pool, obs, tiers, bounds, nil); err != nil {
		return err
	}
	r.quotaStatus.submit(key, statusBatch{settled: true, content: unstampedQuotas(quotas), write: func(ctx context.Context) error {
		return r.writeQuotaStatus(ctx, obs, quotas, pace)
	}})
	return nil
}

// unstampedTiers and unstampedQuotas are statuses as a batch's content:
// without their conditions' transition times, which a status not yet
// written takes from each reconcile's second and which would make every
// second's batch look new.
func unstampedTiers(want []v1alpha1.ServiceTierStatus) []v1alpha1.ServiceTierStatus {
	out := make([]v1alpha1.ServiceTierStatus, len(want))
	for i := range want {
		out[i] = *want[i].DeepCopy()
		clearStamps(out[i].Conditions)
	}
	return out
}

func unstampedQuotas(want []v1alpha1.TenantQuotaStatus) []v1alpha1.TenantQuotaStatus {
	out := make([]v1alpha1.TenantQuotaStatus, len(want))
	for i := range want {
		out[i] = *want[i].DeepCopy()
		clearStamps(out[i].Conditions)
	}
	return out
}

func clearStamps(conds []metav1.Condition) {
	for i := range conds {
		conds[i].LastTransitionTime = metav1.Time{}
	}
}
