package server

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/budget"
	"github.com/tiergate/tiergate/dispatcher/forward"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// statusClientClosed is the requests_total code of a request whose client
// went away before it was answered (nginx's convention).
const statusClientClosed = 499

// Config tunes the data path. It is complete: dispatcher.Config derives
// it, with its defaults applied and its limits checked, and New takes it
// as it is.
type Config struct {
	// MaxBodyBytes bounds a request body; larger gets 413.
	MaxBodyBytes int64
	// BodyTimeout bounds the time to receive a body; slower gets 408.
	BodyTimeout time.Duration
	// MaxQueuedBytes is the budget of the bodies being read and queued;
	// a request whose body would exceed it gets 503 overloaded.
	MaxQueuedBytes int64
	// Forwarder reaches the backends.
	Forwarder *forward.Forwarder
	// Limiter keeps the tenants' budgets (tokens.Local, or Redis in fleet
	// mode).
	Limiter tokens.Limiter
	Log     logr.Logger
}

// errNoForwarder, errNoLimiter: a Config without one, a caller's mistake.
var (
	errNoForwarder = errors.New("server: Config.Forwarder is nil")
	errNoLimiter   = errors.New("server: Config.Limiter is nil")
)

// state is what the data path needs from one policy.
type state struct {
	pool          string
	id            *identity.Identifier
	exempt        map[string]bool
	tierWait      map[string]time.Duration
	clientTimeout time.Duration
	maxTokens     int // the output a request naming no maximum reserves
	budgets       budgets
	// series are the metric series of each tier, and of "" (refused
	// before the tier was known), looked up once per policy.
	series map[string]*metrics.Series
}

// Server is the data-port handler.
type Server struct {
	cfg    Config
	q      *queue.Queue
	bal    *balancer.Balancer
	m      *metrics.Metrics
	fwd    *forward.Forwarder
	bodies *budget.Budget
	lim    tokens.Limiter
	ratio  *tokens.Ratio // the pool's bytes per token, kept across policies
	// estimating holds a place per large body being estimated (tokens.go).
	estimating chan struct{}
	cur        atomic.Pointer[state]
	draining   atomic.Bool
	active     atomic.Int64
	idle       chan struct{} // signalled when active drops to 0
	// noPolicy counts the requests refused before any pool was known.
	noPolicy *metrics.Series
}

// New builds the data path. It serves 503 until SetPolicy.
func New(cfg Config, q *queue.Queue, bal *balancer.Balancer, m *metrics.Metrics) (*Server, error) {
	if cfg.Forwarder == nil {
		return nil, errNoForwarder
	}
	if cfg.Limiter == nil {
		return nil, errNoLimiter
	}
	bodies, err := budget.New(cfg.MaxQueuedBytes)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, q: q, bal: bal, m: m, bodies: bodies, fwd: cfg.Forwarder, lim: cfg.Limiter, ratio: tokens.NewRatio(tokens.DefaultBytesPerToken),
		estimating: make(chan struct{}, runtime.GOMAXPROCS(0)), idle: make(chan struct{}, 1), noPolicy: m.Series("", "")}
	return s, nil
}

// SetPolicy switches the data path to p (already validated). The caller
// updates the queue and balancer first, so a tier this policy introduces is
// known to the queue before any request names it.
func (s *Server) SetPolicy(p *policy.Policy) {
	var prev *identity.Identifier
	if old := s.cur.Load(); old != nil {
		prev = old.id
	}
	st := &state{
		pool:          p.Pool,
		id:            identity.New(p, identity.Reusing(prev)),
		exempt:        make(map[string]bool, len(p.ExemptPaths)),
		tierWait:      make(map[string]time.Duration, len(p.Tiers)),
		clientTimeout: time.Duration(p.ClientTimeoutSeconds * float64(time.Second)),
		maxTokens:     p.MaxTokens(),
		budgets:       budgetsOf(p),
		series:        map[string]*metrics.Series{"": s.m.Series(p.Pool, "")},
	}
	for _, e := range p.ExemptPaths {
		st.exempt[e] = true
	}
	for _, t := range p.Tiers {
		st.tierWait[t.Name] = time.Duration(t.TolerableWaitSeconds * float64(time.Second))
		st.series[t.Name] = s.m.Series(p.Pool, t.Name)
	}
	s.cur.Store(st)
}

// StartDrain makes every new request get 503 draining.
func (s *Server) StartDrain() { s.draining.Store(true) }

// Draining says whether StartDrain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// Bodies are the bytes of request bodies charged to the budget now (being
// read or queued) and the budget.
func (s *Server) Bodies() (held, limit int64) { return s.bodies.Used(), s.bodies.Limit() }

// Active is the number of requests inside the handler.
func (s *Server) Active() int64 { return s.active.Load() }

// WaitIdle returns once no request is inside the handler, or ctx ends.
func (s *Server) WaitIdle(ctx context.Context) error {
	for s.active.Load() > 0 {
		select {
		case <-s.idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (s *Server) leave() {
	if s.active.Add(-1) == 0 {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// ServeHTTP is the data path, and its one exit: the stages return an
// outcome, which exit writes (a refusal) and counts, once per request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.active.Add(1)
	defer s.leave()
	x := getExchange(w, &s.draining)
	o := s.serve(x, r)
	s.exit(x, r, o)
	if o.abort {
		// The exchange is not pooled again: the aborted handler's
		// connection may still be using its writer.
		panic(http.ErrAbortHandler)
	}
	putExchange(x)
}

func (s *Server) serve(x *exchange, r *http.Request) outcome {
	st := s.cur.Load()
	x.st = st
	if r.Method == http.MethodConnect {
		if st != nil {
			x.pool = st.pool
		}
		return refuseConnect(x)
	}
	if s.draining.Load() {
		return refused(apierror.Draining())
	}
	if st == nil {
		return refused(apierror.NoPolicy())
	}
	x.pool = st.pool
	if o, ok := refuseUpgrade(r, st); !ok {
		return o
	}
	who, err := st.id.Identify(r)
	x.tier = who.Tier
	if err != nil {
		return refused(apierror.FromIdentity(err))
	}
	if st.exempt[r.URL.Path] {
		return s.forwardExempt(x, r, st, who)
	}
	// The body is charged to the budget while it is read and queued; it
	// leaves it at dispatch, or here on every other end.
	charge := s.bodies.Open()
	defer charge.Release()
	body, aerr := s.readBody(x.sw.ResponseWriter, r, who.Tier, &charge)
	if aerr != nil {
		// An overloaded refusal holds nothing while the rest of its body
		// is thrown away (after the refusal, by the exit).
		overloaded := aerr.Cause == queue.CauseOverloaded
		return outcome{refusal: aerr, discard: overloaded, began: overloaded && charge.Bytes() > 0}
	}
	if body == nil {
		return clientGone("")
	}
	if o, ok := s.reserve(x, r, st, who, body); !ok {
		return o
	}
	// Settled before the exit writes, so a refusal's headers show the
	// refund.
	defer s.settleTokens(x, r)
	return s.queueAndForward(x, r, st, who, body, &charge)
}

// queueAndForward admits the request, waits for its slot and forwards it,
// releasing the slot exactly once. The body's charge is released once the
// request is dispatched: from then on it is in flight, where the slots
// bound how many bodies are held.
func (s *Server) queueAndForward(x *exchange, r *http.Request, st *state, who identity.Identity, body []byte, charge *budget.Charge) outcome {
	h, err := s.q.AdmitCost(who.Tenant, who.Tier, queue.Cost{Prompt: x.tok.cost.Prompt, Output: x.tok.cost.Output})
	if err != nil {
		return refused(apierror.FromQueue(err, who.Tenant, who.Tier, st.tierWait[who.Tier], st.clientTimeout))
	}
	x.tok.queued = h
	who.Tier, x.tier = h.Tier(), h.Tier()
	if err := h.Wait(r.Context()); err != nil {
		if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
			return clientGone(metrics.StageQueued)
		}
		return refused(apierror.FromQueue(err, who.Tenant, who.Tier, st.tierWait[who.Tier], st.clientTimeout))
	}
	charge.Release()
	dispatched := time.Now()
	defer func() {
		// Only a served request measures the service time (see ReleaseServed).
		if x.served {
			h.ReleaseServed()
		} else {
			h.Release()
		}
		s.series(x).ObserveService(time.Since(dispatched))
	}()
	waited := h.Waited()
	s.series(x).ObserveWait(waited)
	if r.Context().Err() != nil {
		return clientGone(metrics.StageDispatch)
	}
	x.sw.Header().Set(apierror.HeaderQueueWaitMs, strconv.FormatInt(waited.Milliseconds(), 10))
	return s.forward(x, r, st, who, body)
}
