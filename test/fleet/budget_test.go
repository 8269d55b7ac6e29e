package fleet

import (
	"context"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// admission is one admitted request: when its answer came back.
type admission struct{ at time.Time }

// TestTokenBudgetHoldsAcrossDispatchers: 32 clients send one tenant's
// requests through two dispatchers, as fast as they are admitted, for a
// bounded time. Each request reserves 21 tokens (1 of prompt, 20 of
// output) and uses them all (simserver answers 20). The tenant's budget is
// 6000 tokens a minute, so from its first request to any later moment t
// the tokens admitted may not exceed 6000 + 100 × t (its refill) by more
// than one reservation; in Redis mode that holds fleet-wide, and the
// largest excess over every prefix of the run is logged. The same run in
// local mode (each dispatcher keeping the whole budget alone) is the
// control: it must overshoot by far, or the load proves nothing.
func TestTokenBudgetHoldsAcrossDispatchers(t *testing.T) {
	const (
		budget      = 6000
		perSecond   = budget / 60.0
		reservation = 21
		clients     = 32
		runFor      = 5 * time.Second
	)
	for _, mode := range []string{"redis", "local (control)"} {
		t.Run(mode, func(t *testing.T) {
			rs := redistest.Start(t, redistest.Options{})
			sm := startSimArgs(t, "--concurrency", "64", "--service-time", "const:5ms", "--output-tokens", "const:20")
			p := fleetPolicy(sm.Addr, 64, 1000, 64, 1000, map[string]int{"metered": 0})
			p.Tenants[0].Limits = &policy.Limits{TokensPerMinute: budget}
			state := redisURL(rs)
			if mode != "redis" {
				state = "local"
			}
			ds := []*dispatcher{startDispatcher(t, "d1", state, p), startDispatcher(t, "d2", state, p)}

			start := time.Now()
			admitted, refused := flood(t, ds, clients, start.Add(runFor))
			elapsed := admitted[len(admitted)-1].at.Sub(start)
			// The largest excess over C + r×t of any prefix of the run
			// (negative: the closest it came to the bound).
			worst := math.Inf(-1)
			for i, a := range admitted {
				excess := float64((i+1)*reservation) - budget - perSecond*a.at.Sub(start).Seconds()
				worst = max(worst, excess)
			}
			st := sm.Stats(t).Tenants["metered"]
			used := st.PromptTokens + st.CompletionTokens
			// The last settlements follow their answers by moments.
			var settled float64
			testutil.EventuallyTrue(t, 10*time.Second, "every answer settled", func() bool {
				settled = settledTokens(t, ds)
				return settled >= float64(used)
			})
			t.Logf("%s: %d admitted (%d tokens at simserver, %.0f settled by the dispatchers), %d refused, in %s; budget plus refill %.0f; largest excess over it %.1f tokens (one reservation is %d)",
				mode, len(admitted), used, settled, refused, elapsed.Round(time.Millisecond), budget+perSecond*elapsed.Seconds(), worst, reservation)
			if used != int64(len(admitted)*reservation) || settled != float64(used) {
				t.Errorf("simserver counted %d tokens and the dispatchers settled %.0f for %d admitted requests of %d", used, settled, len(admitted), reservation)
			}
			if refused == 0 {
				t.Errorf("no request was refused: the load never reached the budget")
			}
			if mode != "redis" {
				if worst < budget/2 {
					t.Errorf("local mode kept within the budget (excess %.0f) without sharing it: the load is too weak to test anything", worst)
				}
				return
			}
			if worst > reservation {
				t.Errorf("admitted tokens exceeded the budget plus its refill by %.0f, more than one reservation (%d)", worst, reservation)
			}
		})
	}
}

// settledTokens is the tokens_total the dispatchers counted.
func settledTokens(t *testing.T, ds []*dispatcher) float64 {
	t.Helper()
	var n float64
	for _, d := range ds {
		m := d.Metrics(t)
		for _, kind := range []string{"prompt", "completion"} {
			n += m[`tiergate_tokens_total{kind="`+kind+`",pool="fleet/llm",tier="standard"}`]
		}
	}
	return n
}

// startSimArgs starts a simserver with args.
func startSimArgs(t *testing.T, args ...string) *testutil.Simserver {
	t.Helper()
	return testutil.StartSimserver(t, bins.Simserver, testutil.SimOptions{Options: procOpts("simserver"), Args: args})
}

// flood runs clients loops, half through each dispatcher, until the
// deadline, and returns the admitted requests in the order their answers
// came and the number refused (429 rate_limited; a refused client waits
// 50 ms before its next try, to bound the load).
func flood(t *testing.T, ds []*dispatcher, clients int, deadline time.Time) ([]admission, int) {
	t.Helper()
	body := `{"model":"sim-model","prompt":"four","max_tokens":20}`
	var (
		mu       sync.Mutex
		admitted []admission
		refused  int
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(10*time.Second))
	defer cancel()
	for i := range clients {
		d := ds[i%len(ds)]
		wg.Go(func() {
			for time.Now().Before(deadline) {
				code, err := post(ctx, d, body)
				mu.Lock()
				switch {
				case err != nil:
					t.Errorf("%s: %v", d.name, err)
				case code == http.StatusOK:
					admitted = append(admitted, admission{at: time.Now()})
				case code == http.StatusTooManyRequests:
					refused++
				default:
					t.Errorf("%s: status %d", d.name, code)
				}
				mu.Unlock()
				if err != nil {
					return
				}
				if code != http.StatusOK {
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if len(admitted) == 0 {
		t.Fatal("nothing admitted")
	}
	slices.SortFunc(admitted, func(a, b admission) int { return a.at.Compare(b.at) })
	return admitted, refused
}

// post sends one completion as the metered tenant and reads its answer.
func post(ctx context.Context, d *dispatcher, body string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.DataURL("/v1/completions"), strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", "metered")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}
