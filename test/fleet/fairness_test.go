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
// It also logs who got the slots. The Gate lets a dispatcher that frees a
// slot claim it again in the same exchange, so a dispatcher that always
// has work keeps the slots it frees, and the other one waits (see
// docs/fleet.md: "Token fairness across the fleet"); the ordering across
// dispatchers that shared counters give is measured with fair slot
// hand-off by dispatcher/fleet's TestFleetOrderAgainstOneVTC.
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

	type client struct {
		tenant string
		d      *dispatcher
		prompt int
	}
	var clients []client
	for range workers {
		clients = append(clients, client{"long", ds[0], longPrompt}, client{"short", ds[0], shortPrompt}, client{"short", ds[1], shortPrompt})
	}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for _, c := range clients {
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d}`, strings.Repeat("abcd", c.prompt), output)
		wg.Go(func() {
			for ctx.Err() == nil {
				code, err := postAs(context.Background(), c.d, c.tenant, body)
				mu.Lock()
				if err != nil {
					codes[fmt.Sprintf("%s via %s: %v", c.tenant, c.d.name, err)]++
				} else {
					codes[fmt.Sprintf("%s via %s: %d", c.tenant, c.d.name, code)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for what, n := range codes {
		if !strings.HasSuffix(what, ": 200") {
			t.Errorf("%d answers %s, want every one 200", n, what)
		}
	}
	st := sm.Stats(t)
	weighted := func(tenant string) float64 {
		c := st.Tenants[tenant]
		return float64(c.PromptTokens + 2*c.CompletionTokens)
	}
	t.Logf("answers %v; weighted tokens served: long %.0f, short %.0f", codes, weighted("long"), weighted("short"))

	// The dispatchers sync while they have work or deltas pending: the
	// last settlements reach Redis within a sync or two.
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rc.Close()
	key := "tg:{" + p.Pool + "}:vtc:standard"
	want := map[string]float64{"long": weighted("long"), "short": weighted("short")}
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
