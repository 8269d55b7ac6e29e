package simulate

import (
	"fmt"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// dispatcher is one simulated dispatcher pod: its scheduler, its slice
// of the pool and its tenants' budgets (budgets.go).
type dispatcher struct {
	sched    scheduler
	budgets  *tokens.Local
	slots    int
	inflight int
	admitted uint64
}

// tenantAt is a tenant on one dispatcher: its cap there (0: none), its
// requests in flight there, how often it reached the cap, and its part of
// its budgets there (zero: none).
type tenantAt struct {
	limit    int
	inflight int
	capHits  uint64
	budget   policy.Limits
}

func (t *tenantAt) atCap() bool { return t.limit > 0 && t.inflight >= t.limit }

// fleetSize is how many dispatchers the run simulates. In Local mode,
// Load.spec.dispatchers, each with its slice of the pool as the controller
// splits it. In Redis mode the counts are shared and exact fleet-wide, so
// the fleet is one scheduler with the pool-wide numbers.
func (e *engine) fleetSize() int {
	if e.in.Pool.Spec.SharedState == v1alpha1.SharedStateRedis {
		return 1
	}
	return e.load.dispatchers()
}

func (e *engine) addDispatchers(n int) {
	for range n {
		e.disp = append(e.disp, &dispatcher{sched: e.kind.build(e.env), budgets: tokens.NewLocal(e.clk)})
	}
	for _, ts := range e.tenants {
		ts.at = make([]tenantAt, n)
	}
}

// pick is the dispatcher of the next attempt: round-robin, as a Service
// spreads connections.
func (e *engine) pick() int {
	d := e.rr % len(e.disp)
	e.rr++
	return d
}

// settle handles the outcomes of every request that the last operation of
// dispatcher d took off its queue.
func (e *engine) settle(d int) {
	outs, err := e.disp[d].sched.Outcomes()
	if err != nil {
		e.fail(err)
		return
	}
	for _, o := range outs {
		e.resolve(o)
	}
}

// settleAll settles every dispatcher, in order, after an operation on all
// of them.
func (e *engine) settleAll() {
	for d := range e.disp {
		e.settle(d)
	}
}

// check compares the engine's counts with every scheduler's own and
// checks their invariants.
func (e *engine) check(end bool) error {
	queued := make([]int, len(e.tierList))
	tokens := make([]int64, len(e.tierList))
	counted := false
	for d, disp := range e.disp {
		snap, err := disp.sched.Check(end)
		if err != nil {
			return fmt.Errorf("at %s dispatcher %d: %w", e.now, d, err)
		}
		if snap.inflight != disp.inflight {
			return fmt.Errorf("%w: at %s dispatcher %d has %d in flight, the simulation %d", ErrInternal, e.now, d, snap.inflight, disp.inflight)
		}
		if end && snap.admitted != disp.admitted {
			return fmt.Errorf("%w: dispatcher %d admitted %d jobs, the simulation %d", ErrInternal, d, snap.admitted, disp.admitted)
		}
		for i, ts := range e.tierList {
			queued[i] += snap.queued(ts.name)
			if snap.queuedTokens != nil {
				tokens[i] += snap.queuedTokens(ts.name)
				counted = true
			}
		}
		for _, ts := range e.tenants {
			if got := snap.tenantInflight(ts.name); got != ts.at[d].inflight {
				return fmt.Errorf("%w: at %s dispatcher %d tenant %s: %d in flight, the simulation %d", ErrInternal, e.now, d, ts.name, got, ts.at[d].inflight)
			}
		}
	}
	for i, ts := range e.tierList {
		if queued[i] != ts.queued {
			return fmt.Errorf("%w: at %s tier %s: the schedulers have %d queued, the simulation %d", ErrInternal, e.now, ts.name, queued[i], ts.queued)
		}
		if counted && tokens[i] != ts.queuedTokens {
			return fmt.Errorf("%w: at %s tier %s: the queues hold %d weighted tokens, the simulation %d", ErrInternal, e.now, ts.name, tokens[i], ts.queuedTokens)
		}
	}
	return nil
}

// idleDispatchers counts the dispatchers that get no slot at the Load's
// replicas although the pool has some: more dispatchers than slots.
func (e *engine) idleDispatchers() int {
	if e.first.Pool.Concurrency == 0 || len(e.first.Policies) < 2 {
		return 0
	}
	n := 0
	for _, p := range e.first.Policies {
		if p.Slots == 0 {
			n++
		}
	}
	return n
}
