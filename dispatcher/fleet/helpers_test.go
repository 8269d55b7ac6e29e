package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// rawClient is a plain client for seeding and inspecting Redis.
func rawClient(t *testing.T, s *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// rawTLSClient is rawClient for a TLS server.
func rawTLSClient(t *testing.T, s *redistest.Server) *redis.Client {
	t.Helper()
	pem, err := os.ReadFile(s.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2,
		TLSConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// redisNowMs is the Redis server's clock, the one lease scores use.
func redisNowMs(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return tm.UnixMilli()
}

// seed adds members to a sorted set, each expiring offsetMs from now
// (negative: already expired).
func seed(t *testing.T, c *redis.Client, key string, members map[string]int64) {
	t.Helper()
	now := redisNowMs(t, c)
	for m, off := range members {
		if err := c.ZAdd(context.Background(), key, redis.Z{Score: float64(now + off), Member: m}).Err(); err != nil {
			t.Fatalf("ZADD %s: %v", key, err)
		}
	}
}

// members lists a sorted set's members, sorted, without pruning.
func members(t *testing.T, c *redis.Client, key string) []string {
	t.Helper()
	m, err := c.ZRange(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", key, err)
	}
	sort.Strings(m)
	return m
}

// live counts a sorted set's unexpired members.
func live(t *testing.T, c *redis.Client, key string) int {
	t.Helper()
	now := redisNowMs(t, c)
	n, err := c.ZCount(context.Background(), key, "("+strconv.FormatInt(now, 10), "+inf").Result()
	if err != nil {
		t.Fatalf("ZCOUNT %s: %v", key, err)
	}
	return int(n)
}

// fleetPolicy is a Redis-mode policy of pool with one tier.
func fleetPolicy(pool string, slots int) *policy.Policy {
	return &policy.Policy{
		Version: 1, Pool: pool, Slots: slots, ServiceRate: 1, AgeingRate: 6,
		SharedState:    policy.StateRedis,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader},
		Tiers: []policy.Tier{{
			Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20,
			QueueBound: 8, TenantConcurrencyLimit: 2, TenantQueueLimit: 4,
		}},
		Backends: []policy.Backend{{Address: "127.0.0.1:1"}},
	}
}

// newGate builds a Gate on s for pool; the test closes it.
func newGate(t *testing.T, s *redistest.Server, id string, cfg Config, opts ...Option) *Redis {
	t.Helper()
	cfg.URL = s.URL(0)
	cfg.DispatcherID = id
	g, err := New(cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// waitFor waits for a real-time condition (Redis expiry, a process).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, d, what, cond)
}

// withClock injects the clock for renewals, re-check timers and backoff.
func withClock(c clock.WithTickerAndDelayedExecution) Option { return func(o *options) { o.clock = c } }

// crash stops g as a killed process stops: no renewal, no goodbye. Its
// leases stay in Redis until they expire.
func crash(g *Redis) {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		ps := g.ps
		g.mu.Unlock()
		close(g.stop)
		if ps != nil {
			_ = ps.Close()
		}
		g.wg.Wait()
		_ = g.client.Close()
	})
}

// leases is a script of Gate calls: enqueue, claim and return by label,
// each checked against what it must answer.
type leases struct {
	t      *testing.T
	gates  []*Redis
	byName map[string]gate.Lease
	owner  map[string]int
}

func newLeases(t *testing.T, gates ...*Redis) *leases {
	return &leases{t: t, gates: gates, byName: map[string]gate.Lease{}, owner: map[string]int{}}
}

// enqueue asks gate d for a place of tenant (tier "standard") and names
// the lease; want is the result and n the tier count it reports.
func (l *leases) enqueue(d int, name, tenant string, bound, qlimit int, want gate.Result, n int) {
	l.t.Helper()
	p, err := l.gates[d].Enqueue(tenant, "standard", bound, qlimit)
	if err != nil {
		l.t.Fatalf("enqueue %s on d%d: %v", name, d, err)
	}
	if p.Result != want || p.QueuedInTier != n {
		l.t.Fatalf("enqueue %s on d%d: %+v, want %v with %d queued", name, d, p, want, n)
	}
	if want == gate.OK {
		l.byName[name], l.owner[name] = p.Lease, d
	}
}

// claim asks for slots for the named leases, in order, on their gate.
func (l *leases) claim(slots, limit int, want []gate.Result, names ...string) {
	l.t.Helper()
	cs := make([]gate.Claim, len(names))
	for i, n := range names {
		cs[i] = gate.Claim{Lease: l.byName[n], TenantLimit: limit}
	}
	l.gates[l.owner[names[0]]].Exchange(slots, nil, cs)
	got := make([]gate.Result, len(cs))
	for i, c := range cs {
		got[i] = c.Result
	}
	if diff := cmp.Diff(want, got); diff != "" {
		l.t.Fatalf("claims %v (-want +got):\n%s", names, diff)
	}
}

// give returns the named leases on their gate.
func (l *leases) give(names ...string) {
	for _, n := range names {
		l.gates[l.owner[n]].Exchange(0, []gate.Lease{l.byName[n]}, nil)
	}
}

func results(rs ...gate.Result) []gate.Result { return rs }

// counter is a wake function that counts its calls.
type counter struct{ n atomic.Int64 }

func (c *counter) wake()      { c.n.Add(1) }
func (c *counter) get() int64 { return c.n.Load() }
