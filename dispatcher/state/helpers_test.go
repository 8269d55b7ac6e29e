package state

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

	"github.com/redis/go-redis/v9"

	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/state/redistest"
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

// waitFor polls cond (a real-time condition: Redis expiry, a process) until
// it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// counter is a wake function that counts its calls.
type counter struct{ n atomic.Int64 }

func (c *counter) wake()      { c.n.Add(1) }
func (c *counter) get() int64 { return c.n.Load() }
