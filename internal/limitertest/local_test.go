package limitertest_test

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/dispatcher/tokens"
	"github.com/tiergate/tiergate/internal/limitertest"
)

// TestLocalConforms holds tokens.Local to the suite on a fake clock: every
// value is exact (Slack 0), and the limiters of a store are one Local, as
// the clients of one dispatcher share it.
func TestLocalConforms(t *testing.T) {
	limitertest.Run(t, limitertest.Harness{
		New: func(t *testing.T, n int) limitertest.Store {
			clk := clocktesting.NewFakeClock(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
			l := tokens.NewLocal(clk)
			ls := make([]tokens.Limiter, n)
			for i := range ls {
				ls[i] = l
			}
			return limitertest.Store{Limiters: ls, Sleep: clk.Step, Now: clk.Now}
		},
	})
}
