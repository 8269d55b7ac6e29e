package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
	"github.com/tiergate/tiergate/internal/redistest"
)

// TestBudgetsUnavailable: every way Redis can fail a call is an error
// wrapping ErrBudgetsUnavailable and its cause, counted by op; the Gate is
// not degraded by it. A call without a budget never needs Redis.
func TestBudgetsUnavailable(t *testing.T) {
	port := redistest.FreePort(t)
	g, err := New(Config{URL: "redis://127.0.0.1:" + strconv.Itoa(port), OpTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.ObservePolicy(fleetPolicy("ns/llm", 2))
	b := g.Budgets()
	ctx := context.Background()

	d, err := b.Reserve(ctx, budgetKey, policy.Limits{}, 100)
	if err != nil || !d.OK {
		t.Fatalf("Reserve without a budget: %+v, %v; want OK without Redis", d, err)
	}
	_, err = b.Reserve(ctx, budgetKey, budgetLimits, 100)
	want := fmt.Sprintf(`fleet: the token budgets in Redis are unavailable: reserve for tenant "acme" of pool "ns/llm": dial tcp 127.0.0.1:%d: connect: connection refused`, port)
	if !errors.Is(err, ErrBudgetsUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) || err.Error() != want {
		t.Errorf("Reserve: %v\nwant %s", err, want)
	}
	_, err = b.Settle(ctx, budgetKey, budgetLimits, tokens.Settlement{Reserved: 100, Used: 10})
	if !errors.Is(err, ErrBudgetsUnavailable) || !strings.HasPrefix(err.Error(), `fleet: the token budgets in Redis are unavailable: settle for tenant "acme" of pool "ns/llm": `) {
		t.Errorf("Settle: %v", err)
	}
	for _, op := range []string{opReserve, opSettle} {
		if got := testutil.ToFloat64(g.m.errors.WithLabelValues(op)); got != 1 {
			t.Errorf("%s errors: %v, want 1", op, got)
		}
		if n := histCount(t, g, op); n != 1 {
			t.Errorf("%s round trips: %d, want 1", op, n)
		}
	}
	if g.status().Degraded {
		t.Errorf("a budget error degraded the Gate")
	}
}

// TestBudgetsStalledRedisCostsOneTimeout: a frozen server (SIGSTOP) costs
// a call the op timeout, not more; a caller's cancelled context ends it at
// once; after the Gate closes, calls fail with go-redis's ErrClosed.
func TestBudgetsStalledRedisCostsOneTimeout(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	g := newGate(t, s, "d0", Config{OpTimeout: 100 * time.Millisecond})
	b := g.Budgets()
	ctx := context.Background()
	if _, err := b.Reserve(ctx, budgetKey, budgetLimits, 1); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	start := time.Now()
	_, err := b.Reserve(ctx, budgetKey, budgetLimits, 1)
	took := time.Since(start)
	s.Resume()
	// The connection's read deadline (the op timeout) or the context's
	// ends it, whichever fires first.
	timedOut := errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
	if !errors.Is(err, ErrBudgetsUnavailable) || !timedOut {
		t.Errorf("Reserve on a frozen Redis: %v, want ErrBudgetsUnavailable and a deadline", err)
	}
	if took > time.Second {
		t.Errorf("Reserve on a frozen Redis took %s, want about the 100ms op timeout", took)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Settle(cancelled, budgetKey, budgetLimits, tokens.Settlement{}); !errors.Is(err, ErrBudgetsUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Settle with a cancelled context: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, budgetKey, budgetLimits, 1); !errors.Is(err, ErrBudgetsUnavailable) || !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Reserve after Close: %v, want ErrBudgetsUnavailable and redis.ErrClosed", err)
	}
}

// TestBudgetsOnThreeNodeCluster: the budgets of pools whose hash tags live
// on different nodes of a Redis Cluster are reached through any seed node,
// and two dispatchers share each.
func TestBudgetsOnThreeNodeCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	url := "redis://" + nodes[0].Addr() + "?cluster=true&addr=" + nodes[1].Addr()
	var bs []*Budgets
	for i := range 2 {
		g, err := New(Config{URL: url, DispatcherID: "d" + strconv.Itoa(i), OpTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		bs = append(bs, g.Budgets())
	}
	ctx := context.Background()
	owners := map[string]bool{}
	for i := 0; len(owners) < 3 && i < 64; i++ {
		k := tokens.Key{Pool: "ns/p" + strconv.Itoa(i), Tenant: "acme"}
		key := keysFor(k.Pool).budget(k.Tenant)
		if d, err := bs[0].Reserve(ctx, k, budgetLimits, 1000); err != nil || !d.OK {
			t.Fatalf("%s: Reserve on d0: %+v, %v", k.Pool, d, err)
		}
		d, err := bs[1].Reserve(ctx, k, budgetLimits, 5500)
		if err != nil || d.OK || d.Budget != tokens.BudgetTokens || d.Tokens.Remaining < 5000 || d.Tokens.Remaining > 5010 {
			t.Fatalf("%s: Reserve on d1: %+v, %v; want refused with d0's 1000 tokens taken", k.Pool, d, err)
		}
		for j, n := range nodes {
			c := redis.NewClient(&redis.Options{Addr: n.Addr(), Protocol: 2})
			if c.Exists(ctx, key).Val() == 1 {
				owners["node"+strconv.Itoa(j)] = true
			}
			_ = c.Close()
		}
	}
	if len(owners) != 3 {
		t.Errorf("budget keys on %v, want on all 3 nodes", owners)
	}
}
