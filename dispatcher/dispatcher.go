package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/admin"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/fleet"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/server"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// Dispatcher is one dispatcher process's state.
type Dispatcher struct {
	cfg  Config
	q    *queue.Queue
	gate *fleet.Redis // nil in local mode
	// counters share Tokens fairness's counters in fleet mode (nil in
	// local mode).
	counters *fleet.Counters
	bal      *balancer.Balancer
	m        *metrics.Metrics
	srv      *server.Server
	admin    http.Handler

	mu  sync.Mutex // serialises Apply
	pol atomic.Pointer[policy.Policy]
}

// New builds a dispatcher; it serves nothing until Serve. In fleet mode it
// builds the Redis gate (no connection yet), which Serve starts and closes.
func New(cfg Config) (*Dispatcher, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Dispatcher{cfg: cfg, bal: balancer.New(cfg.Health, cfg.Clock)}
	if err := d.build(); err != nil {
		if d.gate != nil {
			_ = d.gate.Close()
		}
		return nil, err
	}
	return d, nil
}

// build makes the queue (behind the fleet's Gate in fleet mode), the
// metrics, the data path and the admin API.
func (d *Dispatcher) build() error {
	cfg := d.cfg
	var opts []queue.Option
	if !fleet.IsLocal(cfg.Fleet.URL) {
		g, err := fleet.New(cfg.Fleet, fleet.WithLogger(cfg.Log.WithName("state")), fleet.WithRegisterer(cfg.Registry))
		if err != nil {
			return err
		}
		d.gate = g
		// The queue exists once the first policy can reach the counters.
		d.counters = g.Counters(func(tier string, others map[string]float64) { d.q.ApplySharedCounters(tier, others) })
		opts = append(opts, queue.WithGate(g), queue.WithCounterSink(d.counters.Add))
	}
	d.q = queue.New(cfg.Clock, opts...)
	m, err := metrics.New(cfg.Registry, d.levels)
	if err != nil {
		return err
	}
	d.m = m
	scfg, err := cfg.serverConfig()
	if err != nil {
		return err
	}
	scfg.Limiter = d.limiter()
	d.srv, err = server.New(scfg, d.q, d.bal, d.m)
	if err != nil {
		return err
	}
	d.admin, err = admin.New(admin.Config{
		Token: cfg.AdminToken, Tokens: cfg.AdminTokens, Gatherer: cfg.Registry,
		Profiling: cfg.Profiling, Log: cfg.Log.WithName("admin"),
	}, d)
	return err
}

// limiter keeps the tenants' budgets: in this process in local mode, and
// in the fleet's Redis in fleet mode, where every dispatcher of the pool
// takes from the same buckets. A budget Redis cannot answer for refuses
// its request as unavailable; the Gate's degraded mode does not extend to
// budgets (docs/fleet.md).
func (d *Dispatcher) limiter() tokens.Limiter {
	if d.gate != nil {
		return d.gate.Budgets()
	}
	return tokens.NewLocal(d.cfg.Clock)
}

// Apply switches to p, which must be valid. A policy for another pool
// than the applied one is refused with a *policy.PoolMismatchError, an
// older version with policy.ErrStaleVersion; the same version is
// re-applied (a resync).
func (d *Dispatcher) Apply(p *policy.Policy) (policy.Ack, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.pol.Load(); cur != nil {
		if err := policy.CheckPool(cur.Pool, p.Pool); err != nil {
			return policy.Ack{}, err
		}
		if err := policy.CheckVersion(cur.Version, p.Version); err != nil {
			return policy.Ack{}, err
		}
	}
	d.bal.Update(p.Backends)
	if d.gate != nil {
		d.gate.ObservePolicy(p) // the pool and mode of the queue's next exchanges
		d.counters.SetTiers(p.Pool, sharedCounterTiers(p))
	}
	d.q.UpdatePolicy(p)
	d.srv.SetPolicy(p)
	tiers := make([]string, len(p.Tiers))
	for i, t := range p.Tiers {
		tiers[i] = t.Name
	}
	d.m.SetTiers(p.Pool, tiers)
	d.pol.Store(p)
	d.cfg.Log.Info("applied policy", "version", p.Version, "pool", p.Pool, "slots", p.Slots, "tiers", len(p.Tiers), "tenants", len(p.Tenants), "backends", len(p.Backends))
	ack := policy.Ack{Version: p.Version, Stats: d.q.Stats().Measured()}
	ack.Stats.UnknownKeyIDs = d.srv.UnknownKeyIDs()
	return ack, nil
}

// sharedCounterTiers are the tiers whose fairness counters the fleet
// shares: every tier in Tokens fairness with Redis shared state, else none.
func sharedCounterTiers(p *policy.Policy) []string {
	if p.SharedState != policy.StateRedis || p.FairnessOf().Mode != policy.FairnessTokens {
		return nil
	}
	tiers := make([]string, len(p.Tiers))
	for i, t := range p.Tiers {
		tiers[i] = t.Name
	}
	return tiers
}

// Policy is the applied policy, or nil.
func (d *Dispatcher) Policy() *policy.Policy { return d.pol.Load() }

// Stats is what GET /v1/stats returns.
type Stats struct {
	Queue    queue.Stats     `json:"queue"`
	Backends []balancer.Load `json:"backends"`
	// Active counts requests inside the data path (queued or in flight).
	Active   int64 `json:"active"`
	Draining bool  `json:"draining"`
	// QueuedBodyBytes is what the bodies being read or queued hold of
	// QueuedBodyBudget (--max-queued-bytes).
	QueuedBodyBytes  int64 `json:"queuedBodyBytes"`
	QueuedBodyBudget int64 `json:"queuedBodyBudget"`
}

// Stats snapshots the dispatcher.
func (d *Dispatcher) Stats() any {
	held, limit := d.srv.Bodies()
	return Stats{Queue: d.q.Stats(), Backends: d.bal.Snapshot(), Active: d.srv.Active(), Draining: d.srv.Draining(),
		QueuedBodyBytes: held, QueuedBodyBudget: limit}
}

// Ready is true with a policy and not draining, unless the policy gives
// this dispatcher no slot while the pool has some (see holdsNoSlot).
func (d *Dispatcher) Ready() (bool, string) {
	p := d.pol.Load()
	switch {
	case d.srv.Draining():
		return false, "draining"
	case p == nil:
		return false, "no policy yet"
	case holdsNoSlot(p):
		return false, fmt.Sprintf("this dispatcher holds no slot of pool %s (policy version %d gives it 0 slots with %d ready backends, in Local mode): it would refuse every request, so it asks to be routed around",
			p.Pool, p.Version, len(p.Backends))
	}
	return true, ""
}

// holdsNoSlot says whether p leaves this dispatcher without a share of a
// pool that can serve: Local mode, 0 slots and at least one ready backend.
// That is a pool with fewer slots than dispatchers, or a dispatcher the
// controller took the share of because it was failing. With no backends
// (no ready replica, or a pool at zero holding requests for its cold
// start) every dispatcher is in the same place and stays Ready, so the
// Service still has endpoints that answer; in Redis mode each holds the
// pool-wide numbers.
func holdsNoSlot(p *policy.Policy) bool {
	return p.SharedState != policy.StateRedis && p.Slots == 0 && len(p.Backends) > 0
}

// levels feeds the scrape-time metrics.
func (d *Dispatcher) levels() metrics.Snapshot {
	p := d.pol.Load()
	if p == nil {
		return metrics.Snapshot{}
	}
	st := d.q.Stats()
	fair := p.FairnessOf().Mode == policy.FairnessTokens
	s := metrics.Snapshot{
		Pool: p.Pool, Slots: st.Slots, InFlight: st.InFlight, PolicyVersion: st.PolicyVersion,
		Tiers:    make(map[string]metrics.TierLevel, len(st.Tiers)),
		Backends: map[string]int64{}, BackendHealth: map[string]metrics.BackendHealth{},
	}
	for name, t := range st.Tiers {
		s.Tiers[name] = metrics.TierLevel{Queued: t.Queued, Bound: t.Bound, OldestAge: t.OldestAge,
			QueuedTokens: t.QueuedTokens, TokenBound: t.TokenBound,
			Fair: fair, FairnessGap: t.FairnessGapTokens, FairnessGapBound: t.FairnessGapBoundTokens}
	}
	for _, l := range d.bal.Snapshot() {
		s.Backends[l.Address] = l.Outstanding
		s.BackendHealth[l.Address] = metrics.BackendHealth{Ejected: l.Ejected, Ejections: l.Ejections}
	}
	s.BodyBytes, s.BodyBudget = d.srv.Bodies()
	s.BytesPerToken = d.srv.BytesPerToken()
	return s
}

// ListenAndServe listens on Config.Listen and Config.AdminListen and calls
// Serve.
func (d *Dispatcher) ListenAndServe(ctx context.Context) error {
	data, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		d.closeGate()
		return fmt.Errorf("data port: %w", err)
	}
	adm, err := net.Listen("tcp", d.cfg.AdminListen)
	if err != nil {
		data.Close()
		d.closeGate()
		return fmt.Errorf("admin port: %w", err)
	}
	return d.Serve(ctx, data, adm)
}

// Serve serves the data port on data and the admin port on adm until ctx
// ends, then drains (see the package doc). It closes both listeners and,
// in fleet mode, starts the Gate with the queue's Kick as its wake-up and
// closes it after the drain. Call it once.
func (d *Dispatcher) Serve(ctx context.Context, data, adm net.Listener) error {
	log := d.cfg.Log
	defer d.closeGate()
	countersCtx, stopCounters := context.WithCancel(context.Background())
	var countersDone sync.WaitGroup
	defer func() { stopCounters(); countersDone.Wait() }() // before closeGate
	if d.gate != nil {
		d.gate.Start(d.q.Kick)
		countersDone.Go(func() {
			d.counters.Run(countersCtx, fleet.DefaultCounterSync, func() bool { return d.q.Queued() > 0 })
		})
	}
	if d.cfg.PolicyFile != "" {
		if err := d.loadFile(nil); err != nil {
			data.Close()
			adm.Close()
			return err
		}
	}
	dataSrv := &http.Server{
		Handler: d.srv, ReadHeaderTimeout: d.cfg.ReadHeaderTimeout, IdleTimeout: d.cfg.IdleTimeout,
		MaxHeaderBytes: d.cfg.MaxHeaderBytes, ErrorLog: server.NewStdLogger(log.WithName("http").V(1)),
	}
	adminSrv := &http.Server{
		Handler: d.admin, ReadHeaderTimeout: d.cfg.ReadHeaderTimeout, ReadTimeout: time.Minute,
		WriteTimeout: time.Minute, IdleTimeout: d.cfg.IdleTimeout, MaxHeaderBytes: d.cfg.MaxHeaderBytes,
		ErrorLog: server.NewStdLogger(log.WithName("http").V(1)),
	}
	errc := make(chan error, 2)
	go func() { errc <- serve(dataSrv, data) }()
	go func() { errc <- serve(adminSrv, adm) }()
	log.Info("serving", "data", data.Addr().String(), "admin", adm.Addr().String())

	watchCtx, stopWatch := context.WithCancel(context.Background())
	var watchDone sync.WaitGroup
	if d.cfg.PolicyFile != "" {
		watchDone.Add(1)
		go func() { defer watchDone.Done(); d.watchFile(watchCtx) }()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		log.Error(serveErr, "server failed; shutting down")
	}
	stopWatch()
	watchDone.Wait()
	d.drain(dataSrv)

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = dataSrv.Shutdown(sctx)
	_ = adminSrv.Shutdown(sctx)
	if serveErr != nil {
		return serveErr
	}
	return nil
}

// closeGate gives back what the fleet's Gate holds and leaves the fleet.
func (d *Dispatcher) closeGate() {
	if d.gate != nil {
		if err := d.gate.Close(); err != nil {
			d.cfg.Log.V(1).Info("closing the Redis connection", "error", err.Error())
		}
	}
}

func serve(s *http.Server, ln net.Listener) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// keepAliveGrace is how long requests are still admitted once keep-alives
// have stopped. A request read on a connection that was busy at that
// instant was sent before its client could learn it should leave; it is
// served, with Connection: close, instead of getting 503 on a reused
// connection.
const keepAliveGrace = 100 * time.Millisecond

// drain runs the shutdown sequence up to the point where no request is
// left inside the data path. Keep-alives end first: idle connections
// close, and every response from now on says Connection: close, so pooled
// clients reconnect (through the Service, elsewhere) instead of reusing a
// connection to this dispatcher. After keepAliveGrace new requests get 503.
func (d *Dispatcher) drain(data *http.Server) {
	log := d.cfg.Log
	start := time.Now()
	data.SetKeepAlivesEnabled(false)
	time.Sleep(keepAliveGrace)
	d.srv.StartDrain()
	d.q.Drain()
	log.Info("draining", "queued", d.q.Stats().Queued, "timeout", d.cfg.DrainTimeout.String())
	t := time.NewTimer(d.cfg.DrainTimeout)
	select {
	case <-d.q.Idle():
	case <-t.C:
		log.Info("drain timeout: refusing the requests still queued", "queued", d.q.Stats().Queued)
	}
	t.Stop()
	d.q.FlushQueued()
	_ = d.srv.WaitIdle(context.Background())
	log.Info("drained", "took", time.Since(start).String())
}
