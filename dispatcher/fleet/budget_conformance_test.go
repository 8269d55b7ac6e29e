package fleet

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tiergate/tiergate/dispatcher/tokens"
	"github.com/tiergate/tiergate/internal/limitertest"
	"github.com/tiergate/tiergate/internal/redistest"
)

// TestBudgetsConform holds the Redis budgets to the suite tokens.Local
// passes: one real redis-server, emptied for each case, and one Gate (its
// own client and connections) per Limiter, as each dispatcher of a pool
// has. Redis keeps time by its own clock, so values are checked within a
// Slack; the fleet case logs how far the admitted tokens stayed under the
// budget with 1, 2 and 3 dispatchers.
func TestBudgetsConform(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ctx := context.Background()
	limitertest.Run(t, limitertest.Harness{
		Slack: 200 * time.Millisecond,
		New: func(t *testing.T, n int) limitertest.Store {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatalf("FLUSHALL: %v", err)
			}
			ls := make([]tokens.Limiter, n)
			for i := range ls {
				// A generous op timeout: 32 clients on a loaded test machine
				// must not turn a slow answer into an error.
				ls[i] = newGate(t, s, "d"+strconv.Itoa(i), Config{OpTimeout: 5 * time.Second}).Budgets()
			}
			now := func() time.Time {
				tm, err := c.Time(ctx).Result()
				if err != nil {
					t.Fatalf("TIME: %v", err)
				}
				return tm
			}
			return limitertest.Store{Limiters: ls, Sleep: time.Sleep, Now: now}
		},
	})
}
