package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// minRecheck keeps re-checks of a blocked queue at least this far apart.
const minRecheck = 10 * time.Millisecond

// Redis is the fleet-mode gate.Gate: tier bounds, tenant queue limits,
// pool slots and tenant concurrency limits counted across every dispatcher
// of a pool in Redis. See the package doc for the protocol.
type Redis struct {
	cfg    Config
	clk    clock.WithTickerAndDelayedExecution
	log    logr.Logger
	client redis.UniversalClient
	id     string
	ttlMs  int64
	m      *metrics

	mu         sync.Mutex
	pool       string // from the last policy; keys of new leases
	poolKeys   keys   // keysFor(pool)
	fleet      bool   // the policy says Redis and names a pool
	degraded   bool   // Redis unreachable: the local slice applies
	closed     bool
	poolSlots  int // pool-wide slots, for the degraded slice
	seq        gate.Lease
	led        *ledger
	pending    []pendingRemoval
	alive      int // dispatchers Redis last listed (0: never reached)
	rank       int // this dispatcher's place among them
	recheck    clock.Timer
	recheckAt  time.Time
	subscribed string // channel the subscriber listens on
	ps         *redis.PubSub
	wake       func()
	started    bool

	calls     sync.WaitGroup // Enqueue and Exchange calls on the network
	wakeCh    chan struct{}
	renewCh   chan struct{}
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ gate.Gate            = (*Redis)(nil)
	_ prometheus.Collector = (*Redis)(nil)
)

// errClosed answers an Enqueue after Close.
var errClosed = errors.New("fleet: the Redis gate is closed")

// pendingRemoval is a lease this dispatcher gave back while Redis could not
// be told. It is removed on reconnection; after a TTL it has expired anyway.
type pendingRemoval struct {
	lease lease
	at    time.Time
}

// Option changes how the Gate runs (not what the flags say).
type Option func(*options)

type options struct {
	clock      clock.WithTickerAndDelayedExecution
	log        logr.Logger
	registerer prometheus.Registerer
}

// WithLogger sets the logger; the default discards.
func WithLogger(l logr.Logger) Option { return func(o *options) { o.log = l } }

// WithRegisterer registers the state metrics (tiergate_state_*) there.
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.registerer = r } }

// New builds the Gate for cfg.URL (redis:// or rediss://). It does not
// touch the network: the first policy naming a pool in Redis mode
// (ObservePolicy) starts fleet mode, and Start starts renewals and
// wake-ups. The dispatcher wires it (dispatcher.New and Serve): it calls
// ObservePolicy before the queue's UpdatePolicy on every accepted policy,
// Start(queue.Kick) when it starts serving and Close after the drain.
func New(cfg Config, opts ...Option) (*Redis, error) {
	cfg.defaults()
	o := options{clock: clock.RealClock{}, log: logr.Discard()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	client, err := cfg.newClient()
	if err != nil {
		return nil, err
	}
	if cfg.DispatcherID == "" {
		cfg.DispatcherID = defaultID()
	}
	g := &Redis{
		cfg:     cfg,
		clk:     o.clock,
		log:     o.log,
		client:  client,
		id:      cfg.DispatcherID,
		ttlMs:   cfg.LeaseTTL.Milliseconds(),
		led:     newLedger(),
		wakeCh:  make(chan struct{}, 1),
		renewCh: make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
	g.m = newMetrics(g)
	// go-redis logs every failed dial; during an outage the Gate's own
	// once-per-transition line is what an operator needs, so its chatter
	// goes to verbose level. (The logger is process-wide.)
	redis.SetLogger(redisLogger{g.log.WithName("go-redis").V(1)})
	if o.registerer != nil {
		if err := g.m.register(o.registerer); err != nil {
			_ = g.client.Close()
			return nil, fmt.Errorf("fleet: register metrics: %w", err)
		}
	}
	return g, nil
}

type redisLogger struct{ l logr.Logger }

func (r redisLogger) Printf(_ context.Context, format string, v ...any) {
	r.l.Info(fmt.Sprintf(format, v...))
}

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "dispatcher"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// status is a snapshot of the Gate for metrics and tests.
type status struct {
	Pool      string
	Fleet     bool // the policy is in Redis mode
	Degraded  bool
	FleetSize int // live dispatchers Redis last listed; 0 before the first renewal
	Rank      int
	Slots     int // in-flight leases this dispatcher holds
	Queued    int // queued leases this dispatcher holds
	Pending   int // removals waiting for Redis
}

func (g *Redis) status() status {
	g.mu.Lock()
	defer g.mu.Unlock()
	return status{
		Pool: g.pool, Fleet: g.fleet, Degraded: g.degraded,
		FleetSize: g.alive, Rank: g.rank,
		Slots: g.led.total[kindSlot], Queued: g.led.total[kindQueued],
		Pending: len(g.pending),
	}
}

// ObservePolicy tells the Gate the policy the queue is about to apply. In
// Redis mode (SharedState "Redis" and a pool name) the Gate counts in
// Redis under that pool; otherwise it only keeps its ledger and grants
// everything, and the queue's own counts enforce the (sliced) policy.
func (g *Redis) ObservePolicy(p *policy.Policy) {
	fleet := p.SharedState == policy.StateRedis && p.Pool != ""
	g.mu.Lock()
	oldPool, oldFleet := g.pool, g.fleet
	g.pool, g.fleet, g.poolSlots = p.Pool, fleet, p.Slots
	if g.poolKeys.tag == "" || p.Pool != oldPool {
		g.poolKeys = keysFor(p.Pool)
	}
	if !fleet && g.degraded {
		g.degraded = false // degraded means something only in fleet mode
	}
	changed := fleet != oldFleet || (fleet && p.Pool != oldPool)
	g.mu.Unlock()
	if !changed {
		return
	}
	if fleet {
		g.log.Info("fleet mode: caps and bounds are shared through Redis", "pool", p.Pool, "dispatcher", g.id)
	} else {
		g.log.Info("the policy is in Local mode: Redis is not used", "pool", p.Pool)
	}
	g.resubscribe()
	if fleet {
		g.renewSoon()
	}
}

// Start starts the renewal loop, the pub/sub subscriber and the waker that
// calls wake (the queue's Kick) when a slot may have freed elsewhere.
// wake is never called from inside a Gate method.
func (g *Redis) Start(wake func()) {
	g.mu.Lock()
	if g.started {
		g.mu.Unlock()
		return
	}
	g.started = true
	g.wake = wake
	g.ps = g.client.Subscribe(context.Background())
	g.mu.Unlock()
	g.resubscribe()
	g.wg.Add(3)
	go g.renewLoop()
	go g.waker()
	go g.subscriber()
}

// Close waits for the Gate's calls in flight, stops the loops, gives back
// what this dispatcher still holds and leaves the fleet, then closes the
// connections. Call it after the drain; later calls answer locally.
func (g *Redis) Close() error {
	var err error
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		g.mu.Unlock()
		g.calls.Wait()
		close(g.stop)
		g.mu.Lock()
		if g.recheck != nil {
			g.recheck.Stop()
		}
		ps := g.ps
		g.mu.Unlock()
		if ps != nil {
			_ = ps.Close()
		}
		g.wg.Wait()
		g.leave()
		err = g.client.Close()
	})
	return err
}

// leave removes this dispatcher's leases and registration, best effort:
// whatever it misses expires within the TTL. The ledger is empty after.
func (g *Redis) leave() {
	g.mu.Lock()
	remote := g.fleet && !g.degraded
	pool := g.pool
	batches := g.batchesLocked()
	g.led = newLedger()
	g.mu.Unlock()
	if !remote {
		return
	}
	for p, b := range batches {
		ks := keysFor(p)
		_, _ = g.run(opLeave, removeScript, append([]string{ks.waiting()}, b.keys...),
			append([]any{ks.freed(), g.id, 1}, b.args()...)...)
	}
	if pool != "" {
		ks := keysFor(pool)
		// A slot held for it goes back to everyone now, not when the hold ends.
		_, _ = g.run(opLeave, removeScript, []string{ks.waiting(), ks.dispatchers(), ks.waiting(), ks.starved(), ks.handoff()},
			"", g.id, 0, 1, g.id, 1, g.id, 1, g.id, 1, g.id)
	}
}

func (g *Redis) remoteLocked() bool { return g.fleet && !g.degraded && !g.closed }

// sliceLocked is this dispatcher's share of poolSlots by the last view of
// the fleet. Before Redis was ever reached it assumes it is alone.
func (g *Redis) sliceLocked(poolSlots int) slice {
	if poolSlots <= 0 {
		poolSlots = g.poolSlots
	}
	return sliceOf(poolSlots, g.alive, g.rank)
}

func (g *Redis) addPendingLocked(ls lease) {
	g.pending = append(g.pending, pendingRemoval{lease: ls, at: g.clk.Now()})
}

// degradeLocked switches to the local slice, once per transition.
func (g *Redis) degradeLocked(op string, err error) {
	if g.degraded || !g.fleet {
		return
	}
	g.degraded = true
	s := g.sliceLocked(g.poolSlots)
	g.log.Error(err, "Redis unreachable: enforcing this dispatcher's slice of the pool-wide limits until it is back",
		"op", op, "pool", g.pool, "dispatchers", max(1, g.alive), "slots", s.slots)
	g.signal(wakeTransition)
}

// run is one EVALSHA (EVAL after a script-cache miss) bounded by OpTimeout.
func (g *Redis) run(op string, s *redis.Script, keys []string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.OpTimeout)
	defer cancel()
	g.m.inflight.Inc()
	defer g.m.inflight.Dec()
	start := g.clk.Now()
	v, err := s.Run(ctx, g.client, keys, args...).Result()
	g.m.ops.WithLabelValues(op).Observe(g.clk.Since(start).Seconds())
	if err != nil {
		g.m.errors.WithLabelValues(op).Inc()
		return nil, fmt.Errorf("fleet: %s: %w", op, err)
	}
	return v, nil
}

// errReply is a script answer of an unexpected shape.
var errReply = errors.New("fleet: unexpected script reply")

// ints reads a script's reply of n integers.
func ints(op string, v any, n int) ([]int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) != n {
		return nil, fmt.Errorf("%w: %s: %v", errReply, op, v)
	}
	out := make([]int64, n)
	for i, x := range a {
		if out[i], ok = x.(int64); !ok {
			return nil, fmt.Errorf("%w: %s: %v", errReply, op, v)
		}
	}
	return out, nil
}
