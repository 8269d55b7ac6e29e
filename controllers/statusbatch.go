package controllers

import (
	"context"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

// statusBatches writes the pools' TenantQuota statuses off the reconcile
// path. A quota's status carries its share of the pool's concurrency, so
// every change of the slots changes every quota of the pool; written
// inline, 200 quotas held the pool's next reconcile, and so the push of
// the policy a scale-down needs, for seconds (docs/benchmarks.md, cluster
// scale). Here a reconcile hands over its pool's batch and goes on; one
// worker writes the batches in turn, and a batch a newer one replaced
// before it began is never written: what people read converges on the
// latest, with one batch of writes per pool in flight at a time.
//
// It is a manager Runnable that runs only on the leader. A batch that
// fails is logged and not retried: the pool's next reconcile (at the
// latest its resync) computes and submits the statuses again.
//
// Concurrency: one mutex guards the pending batches; the worker runs them
// without it, one at a time (each writes its quotas in parallel).
type statusBatches struct {
	log  logr.Logger
	kick chan struct{}

	mu      sync.Mutex
	pending map[types.NamespacedName]func(context.Context) error
	order   []types.NamespacedName // pools with a pending batch, oldest first
}

func newStatusBatches(log logr.Logger) *statusBatches {
	return &statusBatches{log: log, kick: make(chan struct{}, 1), pending: map[types.NamespacedName]func(context.Context) error{}}
}

// submit replaces pool's pending batch by write. It never blocks.
func (b *statusBatches) submit(pool types.NamespacedName, write func(context.Context) error) {
	b.mu.Lock()
	if _, ok := b.pending[pool]; !ok {
		b.order = append(b.order, pool)
	}
	b.pending[pool] = write
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// next takes the oldest pending batch.
func (b *statusBatches) next() (types.NamespacedName, func(context.Context) error, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.order) == 0 {
		return types.NamespacedName{}, nil, false
	}
	pool := b.order[0]
	b.order = b.order[1:]
	write := b.pending[pool]
	delete(b.pending, pool)
	return pool, write, true
}

// Start runs the worker until ctx ends.
func (b *statusBatches) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-b.kick:
		}
		for ctx.Err() == nil {
			pool, write, ok := b.next()
			if !ok {
				break
			}
			if err := write(ctx); err != nil && ctx.Err() == nil {
				b.log.V(1).Info("writing TenantQuota statuses failed; the next reconcile writes them", "pool", pool.String(), "err", err.Error())
			}
		}
	}
}

// NeedLeaderElection: only the leader writes status.
func (b *statusBatches) NeedLeaderElection() bool { return true }
