package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// minRecheck keeps re-checks of a blocked queue at least this far apart.
const minRecheck = 10 * time.Millisecond

// Redis is the fleet-mode queue.Gate: tier bounds, tenant queue limits,
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
	fleet      bool   // the policy says Redis and names a pool
	degraded   bool   // Redis unreachable: the local slice applies
	poolSlots  int    // pool-wide slots, for the degraded slice
	seq        uint64
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

	wakeCh    chan struct{}
	renewCh   chan struct{}
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var _ queue.Gate = (*Redis)(nil)

// pendingRemoval is a lease this dispatcher gave back while Redis could not
// be told. It is removed on reconnection; after a TTL it has expired anyway.
type pendingRemoval struct {
	kind   kind
	tenant string
	tier   string
	lease  lease
	at     time.Time
}

// New builds the Gate for cfg.URL (redis:// or rediss://). It does not
// touch the network: the first policy naming a pool in Redis mode
// (ObservePolicy) starts fleet mode, and Start starts renewals and
// wake-ups. Wire it as:
//
//	g, err := state.New(cfg, state.WithLogger(log), state.WithRegisterer(reg))
//	q := queue.New(clk, queue.WithGate(g))
//	g.Start(q.Kick)
//	// on every accepted policy, before q.UpdatePolicy(p): g.ObservePolicy(p)
//	// on exit, after the drain: g.Close()
func New(cfg Config, opts ...Option) (*Redis, error) {
	cfg.defaults()
	o := options{clock: clock.RealClock{}, log: logr.Discard()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	client, err := cfg.newClient(o.tls)
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
			return nil, fmt.Errorf("state: register metrics: %w", err)
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

// ID is this dispatcher's name in lease members.
func (g *Redis) ID() string { return g.id }

// Status is a snapshot of the Gate for metrics, stats and tests.
type Status struct {
	Pool      string
	Fleet     bool // the policy is in Redis mode
	Degraded  bool
	FleetSize int // live dispatchers Redis last listed; 0 before the first renewal
	Rank      int
	Slots     int // in-flight leases this dispatcher holds
	Queued    int // queued leases this dispatcher holds
	Pending   int // removals waiting for Redis
}

// Status returns a snapshot.
func (g *Redis) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Status{
		Pool: g.pool, Fleet: g.fleet, Degraded: g.degraded,
		FleetSize: g.alive, Rank: g.rank,
		Slots: g.led.total[kindSlot], Queued: g.led.total[kindQueued],
		Pending: len(g.pending),
	}
}

// Degraded reports whether Redis is out of reach and the local slice
// applies (the metric tiergate_state_degraded).
func (g *Redis) Degraded() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.degraded
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

// Enqueue implements queue.Gate.
func (g *Redis) Enqueue(tenant, tier string, tierBound, tenantQueueLimit int) (int, error) {
	g.mu.Lock()
	l := g.newLeaseLocked()
	if !g.remoteLocked() {
		n, err := g.localEnqueueLocked(tenant, tier, l, tierBound, tenantQueueLimit)
		g.mu.Unlock()
		return n, err
	}
	g.mu.Unlock()

	ks := keysFor(l.pool)
	code, n, err := g.runPair(opEnqueue, enqueueScript,
		[]string{ks.tierQueued(tier), ks.tenantQueued(tenant)},
		l.id, g.ttlMs, tierBound, tenantQueueLimit)

	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		// The script may or may not have run. If the local answer admits,
		// the same lease is written back on reconnection (idempotent); if
		// it refuses, a lease that did get in expires unrenewed.
		g.degradeLocked(opEnqueue, err)
		return g.localEnqueueLocked(tenant, tier, l, tierBound, tenantQueueLimit)
	}
	switch code {
	case resOK:
		g.led.push(kindQueued, tenant, tier, l)
		return int(n), nil
	case resTierFull:
		return int(n), queue.ErrQueueFull
	default:
		return int(n), queue.ErrTenantLimit
	}
}

// localEnqueueLocked decides without Redis: in Local mode it admits (the
// queue's own counts already hold), while degraded it enforces the slice.
func (g *Redis) localEnqueueLocked(tenant, tier string, l lease, bound, qlimit int) (int, error) {
	n := g.led.tierQueued[tier]
	if g.fleet {
		s := g.sliceLocked(g.poolSlots)
		if n >= s.scale(bound) {
			return n, queue.ErrQueueFull
		}
		if g.led.tenantCount[kindQueued][tenant] >= s.scale(qlimit) {
			return n, queue.ErrTenantLimit
		}
	}
	g.led.push(kindQueued, tenant, tier, l)
	return n + 1, nil
}

// Acquire implements queue.Gate.
func (g *Redis) Acquire(tenant, tier string, slots, tenantLimit int) queue.AcquireResult {
	g.mu.Lock()
	if slots > 0 {
		g.poolSlots = slots
	}
	q, hasQ := g.led.pop(kindQueued, tenant, tier)
	l := g.newLeaseLocked()
	if !g.remoteLocked() {
		res := g.localAcquireLocked(tenant, tier, l, slots, tenantLimit)
		g.settleQueuedLocked(res, tenant, tier, q, hasQ, false)
		g.mu.Unlock()
		return res
	}
	g.mu.Unlock()

	qm := ""
	if hasQ && q.pool == l.pool {
		qm = q.id
	}
	ks := keysFor(l.pool)
	code, waitMs, err := g.runPair(opAcquire, acquireScript,
		[]string{ks.slots(), ks.tenantSlots(tenant), ks.tierQueued(tier), ks.tenantQueued(tenant), ks.waiting()},
		l.id, g.ttlMs, slots, tenantLimit, qm, g.id)

	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.degradeLocked(opAcquire, err)
		res := g.localAcquireLocked(tenant, tier, l, slots, tenantLimit)
		g.settleQueuedLocked(res, tenant, tier, q, hasQ, true)
		return res
	}
	switch code {
	case resOK:
		g.led.push(kindSlot, tenant, tier, l)
		if hasQ && qm == "" {
			g.addPendingLocked(kindQueued, tenant, tier, q) // held under another pool's keys
		}
		return queue.Granted
	case resPoolFull:
		g.armRecheckLocked(waitMs)
		g.settleQueuedLocked(queue.PoolFull, tenant, tier, q, hasQ, false)
		return queue.PoolFull
	default:
		g.armRecheckLocked(waitMs)
		g.settleQueuedLocked(queue.TenantFull, tenant, tier, q, hasQ, false)
		return queue.TenantFull
	}
}

func (g *Redis) localAcquireLocked(tenant, tier string, l lease, slots, limit int) queue.AcquireResult {
	if g.fleet {
		s := g.sliceLocked(slots)
		if g.led.total[kindSlot] >= s.slots {
			return queue.PoolFull
		}
		if g.led.tenantCount[kindSlot][tenant] >= s.scale(limit) {
			return queue.TenantFull
		}
	}
	g.led.push(kindSlot, tenant, tier, l)
	return queue.Granted
}

// settleQueuedLocked puts a refused job's queued lease back, or, for a
// granted one that Redis may still count, remembers to remove it.
func (g *Redis) settleQueuedLocked(res queue.AcquireResult, tenant, tier string, q lease, hasQ, unknown bool) {
	if !hasQ {
		return
	}
	if res != queue.Granted {
		g.led.push(kindQueued, tenant, tier, q)
		return
	}
	if g.fleet && (g.degraded || unknown) {
		g.addPendingLocked(kindQueued, tenant, tier, q)
	}
}

// Release implements queue.Gate.
func (g *Redis) Release(tenant, tier string) { g.remove(kindSlot, tenant, tier) }

// Dequeue implements queue.Gate.
func (g *Redis) Dequeue(tenant, tier string) { g.remove(kindQueued, tenant, tier) }

func (g *Redis) remove(k kind, tenant, tier string) {
	g.mu.Lock()
	l, ok := g.led.pop(k, tenant, tier)
	if !ok || !g.fleet {
		g.mu.Unlock()
		return
	}
	if g.degraded {
		g.addPendingLocked(k, tenant, tier, l)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()

	ks := keysFor(l.pool)
	op, announce, keys := opDequeue, 0, []string{ks.waiting(), ks.tierQueued(tier), ks.tenantQueued(tenant)}
	if k == kindSlot {
		op, announce, keys = opRelease, 1, []string{ks.waiting(), ks.slots(), ks.tenantSlots(tenant)}
	}
	if _, err := g.run(op, removeScript, keys, ks.freed(), g.id, announce, 1, l.id, 1, l.id); err != nil {
		g.mu.Lock()
		g.degradeLocked(op, err)
		g.addPendingLocked(k, tenant, tier, l)
		g.mu.Unlock()
	}
}

func (g *Redis) remoteLocked() bool { return g.fleet && !g.degraded }

func (g *Redis) newLeaseLocked() lease {
	g.seq++
	return lease{id: g.id + ":" + strconv.FormatUint(g.seq, 36), pool: g.pool}
}

// sliceLocked is this dispatcher's share of poolSlots by the last view of
// the fleet. Before Redis was ever reached it assumes it is alone.
func (g *Redis) sliceLocked(poolSlots int) slice {
	if poolSlots <= 0 {
		poolSlots = g.poolSlots
	}
	return sliceOf(poolSlots, g.alive, g.rank)
}

func (g *Redis) addPendingLocked(k kind, tenant, tier string, l lease) {
	g.pending = append(g.pending, pendingRemoval{kind: k, tenant: tenant, tier: tier, lease: l, at: g.clk.Now()})
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

// armRecheckLocked makes sure the queue asks again within the re-check
// interval, or sooner when the lease that blocks it expires sooner (a
// crashed dispatcher's capacity comes back with no message).
func (g *Redis) armRecheckLocked(waitMs int64) {
	d := g.cfg.RecheckInterval
	if w := time.Duration(waitMs+1) * time.Millisecond; waitMs > 0 && w < d {
		d = w
	}
	d = max(d, minRecheck)
	now := g.clk.Now()
	at := now.Add(d)
	if g.recheck != nil && g.recheckAt.After(now) && !at.Before(g.recheckAt) {
		return // an earlier re-check is armed
	}
	if g.recheck != nil {
		g.recheck.Stop()
	}
	g.recheckAt = at
	// The callback only signals: a FakeClock runs it under its own lock.
	g.recheck = g.clk.AfterFunc(d, func() { g.signal(wakeTimer) })
}

// signal asks the waker to Kick the queue; bursts coalesce.
func (g *Redis) signal(source string) {
	g.m.wakeups.WithLabelValues(source).Inc()
	select {
	case g.wakeCh <- struct{}{}:
	default:
	}
}

func (g *Redis) renewSoon() {
	select {
	case g.renewCh <- struct{}{}:
	default:
	}
}

// run is one EVALSHA (EVAL after a script-cache miss) bounded by OpTimeout.
func (g *Redis) run(op string, s *redis.Script, keys []string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.OpTimeout)
	defer cancel()
	start := g.clk.Now()
	v, err := s.Run(ctx, g.client, keys, args...).Result()
	g.m.ops.WithLabelValues(op).Observe(g.clk.Since(start).Seconds())
	if err != nil {
		g.m.errors.WithLabelValues(op).Inc()
		return nil, fmt.Errorf("state: %s: %w", op, err)
	}
	return v, nil
}

// errReply is a script answer of an unexpected shape.
var errReply = errors.New("state: unexpected script reply")

func (g *Redis) runPair(op string, s *redis.Script, keys []string, args ...any) (int64, int64, error) {
	v, err := g.run(op, s, keys, args...)
	if err != nil {
		return 0, 0, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return 0, 0, fmt.Errorf("%w: %s: %v", errReply, op, v)
	}
	x, ok1 := a[0].(int64)
	y, ok2 := a[1].(int64)
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("%w: %s: %v", errReply, op, v)
	}
	return x, y, nil
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

// Close stops the loops, gives back what this dispatcher still holds and
// leaves the fleet, then closes the connections. Call it after the drain.
func (g *Redis) Close() error {
	var err error
	g.closeOnce.Do(func() {
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
// whatever it misses expires within the TTL.
func (g *Redis) leave() {
	g.mu.Lock()
	if !g.fleet || g.degraded {
		g.mu.Unlock()
		return
	}
	pool := g.pool
	batches := g.batchesLocked()
	g.mu.Unlock()
	for p, b := range batches {
		ks := keysFor(p)
		_, _ = g.run(opRelease, removeScript, append([]string{ks.waiting()}, b.keys...),
			append([]any{ks.freed(), g.id, 1}, b.args()...)...)
	}
	if pool != "" {
		ks := keysFor(pool)
		_, _ = g.run(opRelease, removeScript, []string{ks.waiting(), ks.dispatchers(), ks.waiting()},
			"", g.id, 0, 1, g.id, 1, g.id)
	}
}
