package simulate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// bridgeTimeout guards against a queue that does not resolve a Wait it
// counted; it is real time and never reached in a healthy run.
const bridgeTimeout = 10 * time.Second

// queueScheduler is the real dispatcher queue behind the scheduler seam.
//
// Handle.Wait blocks, so each queued request has one goroutine parked in
// Wait that reports on results. The queue dispatches and expires
// synchronously inside Admit, Release, UpdatePolicy and ExpireDue, and its
// Stats count what it resolved: Outcomes collects exactly that many and
// sorts them by request, so a run never depends on goroutine scheduling.
type queueScheduler struct {
	q       *queue.Queue
	results chan outcome
	got     []outcome
	guard   *time.Timer
	// resolved is how many resolved Waits the queue had counted at the
	// last collection.
	resolved uint64
	queued   map[*request]struct{}
	// tokenBound is each tier's bound in weighted tokens under the
	// policy in force (0: bounded in requests), for Check.
	tokenBound map[string]int64
}

var _ scheduler = (*queueScheduler)(nil)

// queueTicket is the queue's side of an admitted request.
type queueTicket struct {
	h      *queue.Handle
	cancel context.CancelFunc
}

func newQueueScheduler(clk *clocktesting.FakeClock) *queueScheduler {
	return &queueScheduler{
		q:          queue.New(clk),
		results:    make(chan outcome, 256),
		queued:     map[*request]struct{}{},
		tokenBound: map[string]int64{},
	}
}

func (s *queueScheduler) UpdatePolicy(p *policy.Policy) {
	clear(s.tokenBound)
	for _, t := range p.Tiers {
		s.tokenBound[t.Name] = t.QueueTokenBound
	}
	s.q.UpdatePolicy(p)
}

// Admit offers r with its reservation, its prompt and the output it may
// generate, as the dispatcher estimates it (the simulated estimate is
// exact).
func (s *queueScheduler) Admit(r *request) error {
	h, err := s.q.AdmitCost(r.ten.name, r.ten.tier.name, queue.Cost{Prompt: r.cost.prompt, Output: r.cost.maxOut})
	if err != nil {
		return err
	}
	s.queued[r] = struct{}{}
	ctx, cancel := context.WithCancel(context.Background())
	r.ticket = queueTicket{h: h, cancel: cancel}
	go func() { s.results <- outcome{req: r, err: h.Wait(ctx)} }()
	return nil
}

func (s *queueScheduler) Outcomes() ([]outcome, error) {
	tot := s.q.Stats().Totals
	total := tot.Dispatched + tot.Expired + tot.Drained
	n := int(total - s.resolved)
	if n <= 0 {
		return nil, nil
	}
	s.resolved = total
	clear(s.got)
	got := s.got[:0]
	for len(got) < n {
		o, ok := s.receive()
		if !ok {
			return nil, fmt.Errorf("%w: the queue counted %d resolved waits but only %d returned", ErrInternal, n, len(got))
		}
		got = append(got, s.collect(o))
	}
	slices.SortFunc(got, func(a, b outcome) int { return cmp.Compare(a.req.id, b.req.id) })
	s.got = got
	return got, nil
}

func (s *queueScheduler) Withdraw(r *request) (outcome, error) {
	r.ticket.cancel()
	o, ok := s.receive()
	if !ok {
		return outcome{}, fmt.Errorf("%w: Wait of request %d did not return after cancel", ErrInternal, r.id)
	}
	if o.req != r {
		return outcome{}, fmt.Errorf("%w: cancelling request %d resolved request %d", ErrInternal, r.id, o.req.id)
	}
	if o.err == nil {
		// Dispatch won the race: the queue counts it, so Outcomes must not
		// wait for it.
		s.resolved++
	}
	return s.collect(o), nil
}

// collect takes a returned Wait off the books.
func (s *queueScheduler) collect(o outcome) outcome {
	r := o.req
	delete(s.queued, r)
	r.ticket.cancel() // Wait has returned: this only frees the context
	if o.err == nil {
		o.waited = r.ticket.h.Waited()
	}
	return o
}

// receive takes the next Wait outcome; false after bridgeTimeout of real
// time without one.
func (s *queueScheduler) receive() (outcome, bool) {
	select {
	case o := <-s.results:
		return o, true
	default:
	}
	if s.guard == nil {
		s.guard = time.NewTimer(bridgeTimeout)
	} else {
		s.guard.Reset(bridgeTimeout)
	}
	defer s.guard.Stop()
	select {
	case o := <-s.results:
		return o, true
	case <-s.guard.C:
		return outcome{}, false
	}
}

func (s *queueScheduler) Settle(r *request, prompt, output int64) { r.ticket.h.Settle(prompt, output) }

// Release is the dispatcher's: ReleaseServed for an answer its client
// received, so that the queue measures service time and tokens per
// slot-second from it as it would live.
func (s *queueScheduler) Release(r *request, served bool) {
	if served {
		r.ticket.h.ReleaseServed()
		return
	}
	r.ticket.h.Release()
}

func (s *queueScheduler) Measured() (float64, uint64) {
	st := s.q.Stats()
	return st.TokensPerSlotSecond, st.Served
}

func (s *queueScheduler) NextDeadline() (time.Duration, bool) {
	dl, ok := s.q.NextDeadline()
	return dl.Sub(epoch), ok
}

func (s *queueScheduler) ExpireDue() { s.q.ExpireDue() }

// Close cancels every still-queued Wait and waits for it to return.
func (s *queueScheduler) Close() error {
	for r := range s.queued {
		r.ticket.cancel()
	}
	for range len(s.queued) {
		if _, ok := s.receive(); !ok {
			return fmt.Errorf("%w: queued Waits did not return after cancel", ErrInternal)
		}
	}
	return nil
}

func (s *queueScheduler) WatchesClients() bool { return true }

// Check checks the queue's bounds (docs/architecture.md#the-queue), in
// requests or in weighted tokens, and, at the end,
// that every job it admitted ended exactly once or is still queued or in
// flight, and that no slot was released twice.
func (s *queueScheduler) Check(end bool) (snapshot, error) {
	st := s.q.Stats()
	for name, qt := range st.Tiers {
		// A request larger than the token bound may queue alone.
		if tb := s.tokenBound[name]; tb > 0 {
			if qt.QueuedTokens > tb && qt.Queued > 1 {
				return snapshot{}, fmt.Errorf("%w: tier %s: %d weighted tokens in %d queued requests exceed its token bound %d", ErrInternal, name, qt.QueuedTokens, qt.Queued, tb)
			}
		} else if qt.Queued > qt.Bound {
			return snapshot{}, fmt.Errorf("%w: tier %s: %d queued exceeds its bound %d", ErrInternal, name, qt.Queued, qt.Bound)
		}
	}
	t := st.Totals
	if end {
		if ended := t.Dispatched + t.Abandoned + t.Expired + t.Drained + uint64(st.Queued); t.Admitted != ended {
			return snapshot{}, fmt.Errorf("%w: the queue admitted %d jobs but %d ended or are queued", ErrInternal, t.Admitted, ended)
		}
		if st.Completed+uint64(st.InFlight) != t.Dispatched {
			return snapshot{}, fmt.Errorf("%w: %d dispatched, %d completed, %d in flight", ErrInternal, t.Dispatched, st.Completed, st.InFlight)
		}
		if st.DoubleReleases != 0 {
			return snapshot{}, fmt.Errorf("%w: %d double releases", ErrInternal, st.DoubleReleases)
		}
	}
	return snapshot{
		inflight:       st.InFlight,
		admitted:       t.Admitted,
		queued:         func(tier string) int { return st.Tiers[tier].Queued },
		queuedTokens:   func(tier string) int64 { return st.Tiers[tier].QueuedTokens },
		tenantInflight: func(tenant string) int { return st.TenantInFlight[tenant] },
	}, nil
}
