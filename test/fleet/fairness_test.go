package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// TestTokenFairnessAcrossDispatchers: two fleet-mode dispatchers in
// Tokens fairness share a pool of two slots and their fairness counters
// through a real redis-server, in front of a simserver whose service time
// is prompt ÷ prefill + output ÷ decode. A tenant with 40× longer prompts
// reaches the first dispatcher only, one with short prompts both. Every
// request is answered 200, and the counters in Redis end equal, for each
// tenant, to the weighted tokens simserver served it: every dispatch
// charged its reservation there and every settlement corrected it to what
// was used, each once, from both dispatchers.
//
// The first dispatcher's clients start alone and take both slots; the
// second's start then. The Gate hands a slot a dispatcher frees to the
// other one when that one waits (docs/fleet.md: "Fair hand-off"), so from
// a second on each dispatcher holds a fair part of the slots (sampled
// from their /metrics), and the long-prompt tenant, which only the first
// reaches, gets about half the weighted tokens served meanwhile. Without
// the hand-off the first dispatcher kept every slot it freed and the
// second got none.
func TestTokenFairnessAcrossDispatchers(t *testing.T) {
	const (
		longPrompt, shortPrompt, output = 1000, 25, 20
		workers                         = 6 // per tenant and dispatcher it reaches
		run                             = 6 * time.Second
	)
	rs := redistest.Start(t, redistest.Options{})
	sm := startSimArgs(t, "--concurrency", "2", "--bytes-per-token", "4",
		"--prefill-tokens-per-second", "4000", "--decode-tokens-per-second", "200")
	p := fleetPolicy(sm.Addr, 2, 100, 2, 50, map[string]int{"long": 0, "short": 0})
	p.Fairness = &policy.Fairness{Mode: policy.FairnessTokens}
	ds := []*dispatcher{startDispatcher(t, "d1", redisURL(rs), p), startDispatcher(t, "d2", redisURL(rs), p)}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := &closedLoop{codes: map[string]int{}}
	for range workers {
		l.start(ctx, "long", ds[0], longPrompt, output)
		l.start(ctx, "short", ds[0], shortPrompt, output)
	}
	testutil.EventuallyTrue(t, 5*time.Second, "d1 to hold both slots", func() bool {
		return ds[0].Metrics(t)[`tiergate_state_leases{kind="slot"}`] == 2
	})
	for range workers {
		l.start(ctx, "short", ds[1], shortPrompt, output)
	}
	var base testutil.SimStats
	held := sampleSlots(t, ds, time.Second, run, func() { base = sm.Stats(t) })
	// The share is of what was served within the window: once the load
	// stops, every client's last request still completes, and the six
	// long ones would add six long requests to one side.
	end := sm.Stats(t)
	cancel()
	l.wg.Wait()
	for what, n := range l.codes {
		if !strings.HasSuffix(what, ": 200") {
			t.Errorf("%d answers %s, want every one 200", n, what)
		}
	}
	st := sm.Stats(t)
	weighted := func(st testutil.SimStats, tenant string) float64 {
		c := st.Tenants[tenant]
		return float64(c.PromptTokens + 2*c.CompletionTokens)
	}
	long, short := weighted(end, "long")-weighted(base, "long"), weighted(end, "short")-weighted(base, "short")
	share := long / (long + short)
	t.Logf("answers %v; weighted tokens served from 1s to %s after d2's clients started: long %.0f, short %.0f (long's share %.3f)", l.codes, run, long, short, share)
	if share < 0.35 || share > 0.65 {
		t.Errorf("the long-prompt tenant got %.3f of the weighted tokens, want 0.35..0.65", share)
	}
	total := held[0] + held[1]
	t.Logf("slots held on average: %s %.2f, %s %.2f", ds[0].name, held[0], ds[1].name, held[1])
	for i, d := range ds {
		if total == 0 || held[i]/total < 0.3 || held[i]/total > 0.7 {
			t.Errorf("%s held %.2f of %.2f slots on average, want 0.3..0.7 of them", d.name, held[i], total)
		}
	}
	checkSharedCounters(t, rs, "tg:{"+p.Pool+"}:vtc:standard", map[string]float64{"long": weighted(st, "long"), "short": weighted(st, "short")})
}

// closedLoop is clients, each sending one completion after the
// other until its context ends, and the answers they got.
type closedLoop struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	codes map[string]int
}

func (l *closedLoop) start(ctx context.Context, tenant string, d *dispatcher, prompt, output int) {
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d}`, strings.Repeat("abcd", prompt), output)
	l.wg.Go(func() {
		for ctx.Err() == nil {
			code, err := postAs(context.Background(), d, tenant, body)
			l.mu.Lock()
			if err != nil {
				l.codes[fmt.Sprintf("%s via %s: %v", tenant, d.name, err)]++
			} else {
				l.codes[fmt.Sprintf("%s via %s: %d", tenant, d.name, code)]++
			}
			l.mu.Unlock()
		}
	})
}

// checkSharedCounters waits until the counters hash key equals want: the
// dispatchers sync while they have work or deltas pending, so the last
// settlements reach Redis within a sync or two.
func checkSharedCounters(t *testing.T, rs *redistest.Server, key string, want map[string]float64) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rc.Close()
	testutil.Eventually(t, 10*time.Second, "the shared counters equal what was served", func() error {
		raw, err := rc.HGetAll(context.Background(), key).Result()
		if err != nil {
			return err
		}
		got := map[string]float64{}
		for tenant, v := range raw {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("%s: %q: %w", tenant, v, err)
			}
			got[tenant] = f
		}
		if diff := cmp.Diff(want, got); diff != "" {
			return fmt.Errorf("%s (-served +counters):\n%s", key, diff)
		}
		return nil
	})
}

// sampleSlots samples each dispatcher's slot leases every 100 ms for run,
// from skip on (calling mark then), and returns their means.
func sampleSlots(t *testing.T, ds []*dispatcher, skip, run time.Duration, mark func()) []float64 {
	t.Helper()
	sums, n := make([]float64, len(ds)), 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for time.Since(start) < run {
		<-tick.C
		if time.Since(start) < skip {
			continue
		}
		if n == 0 {
			mark()
		}
		for i, d := range ds {
			sums[i] += d.Metrics(t)[`tiergate_state_leases{kind="slot"}`]
		}
		n++
	}
	for i := range sums {
		sums[i] /= float64(max(n, 1))
	}
	return sums
}

// postAs sends one completion as tenant and reads its answer.
func postAs(ctx context.Context, d *dispatcher, tenant, body string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.DataURL("/v1/completions"), strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", tenant)
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}
