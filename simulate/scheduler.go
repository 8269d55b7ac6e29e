package simulate

import (
	"time"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// scheduler is what the engine sends requests through: the real dispatcher
// queue (queueScheduler), and any other scheduler a run is compared with.
//
// The engine calls it from one goroutine, at the simulated time of the
// clock the scheduler was built with. A request the scheduler admits leaves
// the queue exactly once, reported by Outcomes or Withdraw; a dispatched
// one holds its slot until Release.
type scheduler interface {
	// UpdatePolicy installs a policy, as the controller's push would. It
	// may dispatch or expire queued requests: Outcomes reports them.
	UpdatePolicy(p *policy.Policy)
	// Admit offers r. nil: r is queued, or dispatched at once, and
	// Outcomes reports it. Otherwise the refusal: a *queue.Refusal (429,
	// with its Retry-After) or queue.ErrNoCapacity (503).
	Admit(r *request) error
	// Outcomes returns, in request order, the requests that left the queue
	// since the last call. The slice is valid until the next call.
	Outcomes() ([]outcome, error)
	// Withdraw is r's client disconnecting while r is queued. It returns
	// r's outcome: withdrawn, or dispatched if dispatch won the race.
	Withdraw(r *request) (outcome, error)
	// Release gives back the slot of a dispatched request whose generation
	// completed or was cancelled. It may dispatch queued requests.
	Release(r *request)
	// NextDeadline is the simulated time at which the oldest queued request
	// expires; false when none will.
	NextDeadline() (time.Duration, bool)
	// ExpireDue expires every queued request whose deadline has come.
	ExpireDue()
	// Verify compares the engine's counts with the scheduler's own and
	// checks the scheduler's invariants: after an event, or at the end of
	// the run (end). Only tests turn it on.
	Verify(e *engine, end bool) error
	// Close ends every request still queued, so that nothing outlives the
	// run.
	Close() error
}

// outcome is how an admitted request left the queue.
type outcome struct {
	req *request
	// err is nil when the request was dispatched, queue.ErrExpired when
	// the queue expired it and context.Canceled when its client withdrew
	// it.
	err error
	// waited is enqueue to dispatch, as the scheduler measured it; set
	// when the request was dispatched.
	waited time.Duration
}
