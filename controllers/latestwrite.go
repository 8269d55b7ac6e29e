package controllers

import (
	"context"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
)

// latestWrites runs each pool's ServiceTier status writes off the
// reconcile path, at once. controller-runtime reconciles a pool one event
// at a time, so writes done inline after the push held the next event (a
// pod's deletion, whose removal must reach the dispatchers within 100 ms)
// for their round trips: 150-270 ms on a loaded machine. A pool's writes
// run one batch at a time; a batch submitted while one runs waits, and a
// newer one replaces it, so no batch computed earlier lands after a later
// one.
//
// It is a manager Runnable that runs only on the leader. A batch that
// fails is logged; the pool's next reconcile (at the latest its resync)
// computes and submits it again.
//
// Concurrency: one mutex guards the pending batches and which pools have a
// batch running; each running pool has a goroutine of its own, which takes
// the pool's waiting batch when its batch ends.
type latestWrites struct {
	log logr.Logger

	mu      sync.Mutex
	ctx     context.Context // nil until Start
	stopped bool            // Start is waiting for the running batches
	running map[types.NamespacedName]bool
	waiting map[types.NamespacedName]func(context.Context) error
	wg      sync.WaitGroup
}

func newLatestWrites(log logr.Logger) *latestWrites {
	return &latestWrites{log: log, running: map[types.NamespacedName]bool{}, waiting: map[types.NamespacedName]func(context.Context) error{}}
}

// submit makes write the pool's next batch, replacing one still waiting.
// It never blocks.
func (w *latestWrites) submit(pool types.NamespacedName, write func(context.Context) error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting[pool] = write
	w.runLocked(pool)
}

// runLocked starts a goroutine for the pool's waiting batch unless one is
// running or Start has not come.
func (w *latestWrites) runLocked(pool types.NamespacedName) {
	if w.ctx == nil || w.stopped || w.running[pool] {
		return
	}
	w.running[pool] = true
	w.wg.Go(func() { w.drain(pool) })
}

// drain writes the pool's batches until none waits.
func (w *latestWrites) drain(pool types.NamespacedName) {
	for {
		w.mu.Lock()
		write, ok := w.waiting[pool]
		delete(w.waiting, pool)
		if !ok || w.ctx.Err() != nil {
			delete(w.running, pool)
			w.mu.Unlock()
			return
		}
		ctx := w.ctx
		w.mu.Unlock()
		if err := write(ctx); err != nil && ctx.Err() == nil {
			w.log.Info("writing ServiceTier statuses failed; the next reconcile writes them", "pool", pool.String(), "err", err.Error())
		}
	}
}

// Start runs the batches submitted until ctx ends, then waits for those
// running.
func (w *latestWrites) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	for pool := range w.waiting {
		w.runLocked(pool)
	}
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	w.stopped = true // no goroutine starts after this: wg.Wait is safe
	w.mu.Unlock()
	w.wg.Wait()
	return nil
}

// NeedLeaderElection: only the leader writes status.
func (w *latestWrites) NeedLeaderElection() bool { return true }
