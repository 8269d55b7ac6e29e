package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// TestStressConcurrent runs many goroutines against one queue on the real
// clock (expiry fires from real timers) while policies change underneath;
// run it with -race. Holders count themselves between Wait and Release, so
// they can never exceed what the queue allowed.
func TestStressConcurrent(t *testing.T) { stressConcurrent(t, false) }

// TestStressConcurrentTokens is the same load in Tokens fairness with
// token bounds on one tier, requests of random sizes and Settle from
// another goroutine than Release.
func TestStressConcurrentTokens(t *testing.T) { stressConcurrent(t, true) }

func stressConcurrent(t *testing.T, tokens bool) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const workers, iterations = 32, 300
	big := seedPolicy(8)
	big.ClientTimeoutSeconds = 0.05
	small := seedPolicy(3)
	small.ClientTimeoutSeconds = 0.02
	small.Tiers[0].TenantConcurrencyLimit = 2
	if tokens {
		for _, p := range []*policy.Policy{big, small} {
			p.Fairness = &policy.Fairness{Mode: policy.FairnessTokens}
			p.Tiers[1].QueueTokenBound, p.Tiers[1].TenantQueueTokenLimit = 20000, 6000
			p.Tenants = []policy.Tenant{{ID: "t1", Tier: "standard", Weight: 3}}
		}
	}
	q := New(clock.RealClock{})
	q.UpdatePolicy(big)

	var holding atomic.Int64
	var tenantHolding [8]atomic.Int64
	var served, refused, expired, abandoned atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for range iterations {
				ti := rng.IntN(len(tenantHolding))
				tier := tierNames[ti%3]
				c := Cost{}
				if tokens {
					c = Cost{Prompt: rng.Int64N(4000), Output: rng.Int64N(600)}
				}
				h, err := q.AdmitCost(fmt.Sprint("t", ti), tier, c)
				if err != nil {
					var r *Refusal
					if !errors.As(err, &r) {
						errs <- fmt.Errorf("Admit: %v", err)
						return
					}
					refused.Add(1)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
				if rng.IntN(3) == 0 {
					cancel()
					ctx, cancel = context.WithCancel(context.Background())
				}
				err = h.Wait(ctx)
				cancel()
				switch {
				case err == nil:
					if n := holding.Add(1); n > 8 {
						errs <- fmt.Errorf("%d holders over 8 slots", n)
					}
					if n := tenantHolding[ti].Add(1); n > 6 {
						errs <- fmt.Errorf("tenant t%d: %d holders over its largest limit 6", ti, n)
					}
					for range rng.IntN(50) {
						runtime.Gosched()
					}
					tenantHolding[ti].Add(-1)
					holding.Add(-1)
					served.Add(1)
					var settled sync.WaitGroup
					if tokens {
						settled.Go(func() { h.Settle(c.Prompt/2, c.Output/3) })
					}
					h.Release()
					settled.Wait()
					if rng.IntN(10) == 0 {
						h.Release()
					}
				case errors.Is(err, ErrExpired):
					expired.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					abandoned.Add(1)
				default:
					errs <- fmt.Errorf("Wait: %v", err)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var side sync.WaitGroup
	side.Add(1)
	go func() { // policy flapping and stats readers
		defer side.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				q.UpdatePolicy(small)
			} else {
				q.UpdatePolicy(big)
			}
			_ = q.Stats()
			q.Kick()
			runtime.Gosched()
		}
	}()
	wg.Wait()
	close(stop)
	side.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	q.UpdatePolicy(big)
	select {
	case <-q.Idle():
	case <-time.After(10 * time.Second):
		t.Fatal("queue not idle")
	}
	s := q.Stats()
	t.Logf("served %d refused %d expired %d abandoned %d double releases %d", served.Load(), refused.Load(), expired.Load(), abandoned.Load(), s.DoubleReleases)
	if uint64(served.Load()) != s.Completed || uint64(expired.Load()) != s.Totals.Expired {
		t.Fatalf("served %d expired %d, queue completed %d expired %d", served.Load(), expired.Load(), s.Completed, s.Totals.Expired)
	}
	// Wait returns nil whenever dispatch wins the race with ctx, so every
	// ctx error seen by a worker is an abandonment the queue counted.
	if uint64(abandoned.Load()) != s.Totals.Abandoned {
		t.Fatalf("abandoned %d, queue says %d", abandoned.Load(), s.Totals.Abandoned)
	}
	assertEmpty(t, q)
}
