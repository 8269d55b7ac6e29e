package dispatcher

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// TestTokenFairnessLive runs the real dispatcher in front of a simserver
// whose service times are proportional to tokens (prompt ÷ prefill +
// output ÷ decode), with two tenants of one tier whose prompts differ 40×
// and the same number of closed-loop clients each. In Requests mode the
// tier serves them by age, so each gets about as many requests and the
// long-prompt tenant most of the tokens; in Tokens mode it serves the
// tenant with the smaller virtual token counter, so each gets about half
// the weighted tokens. Every request is answered 200 in both modes, and
// the fairness gap the dispatcher reports never exceeds its bound.
func TestTokenFairnessLive(t *testing.T) {
	const (
		shortPrompt = 25   // tokens, at simserver's 4 bytes a token
		longPrompt  = 1000 // 40× the short one
		output      = 20
		workers     = 6 // per tenant, against 2 slots
		run         = 6 * time.Second
	)
	sim := startSim(t, "--concurrency", "2", "--bytes-per-token", "4",
		"--prefill-tokens-per-second", "4000", "--decode-tokens-per-second", "200")
	d := startDispatcher(t, dispOpts{})
	body := func(tokens int) string {
		return fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d}`, strings.Repeat("abcd", tokens), output)
	}
	weighted := func(prompt, completion int64) float64 { return float64(prompt + 2*completion) }

	for i, mode := range []string{policy.FairnessRequests, policy.FairnessTokens} {
		t.Run(mode, func(t *testing.T) {
			p := basePolicy(int64(i+1), 2, sim.Addr)
			p.Tiers = []policy.Tier{policyTier("standard", 0, 30, 80, 2, 40)}
			p.DefaultTier = "standard"
			p.Tenants = []policy.Tenant{tenant("long", "standard"), tenant("short", "standard")}
			p.Fairness = &policy.Fairness{Mode: mode}
			d.MustPutPolicy(t, p)
			sim.ResetStats(t)

			ctx, cancel := context.WithTimeout(context.Background(), run)
			defer cancel()
			var mu sync.Mutex
			codes := map[string]map[int]int{"long": {}, "short": {}}
			var wg sync.WaitGroup
			for _, who := range []struct {
				tenant string
				prompt int
			}{{"long", longPrompt}, {"short", shortPrompt}} {
				for range workers {
					wg.Go(func() {
						for ctx.Err() == nil {
							// Each request runs to its end: the run's end
							// stops new ones, never cuts one.
							r := d.fetch(context.Background(), t, call{tenant: who.tenant, body: body(who.prompt)})
							mu.Lock()
							if r.err != nil {
								codes[who.tenant][-1]++
							} else {
								codes[who.tenant][r.code]++
							}
							mu.Unlock()
						}
					})
				}
			}
			gaps := sampleGaps(ctx, t, d, "standard")
			// What was served while both were backlogged: the requests
			// queued at the end are served after it, one tenant's as many
			// as the other's, and would blur the shares.
			st := sim.Stats(t)
			wg.Wait()

			for tenant, c := range codes {
				for code, n := range c {
					if code != http.StatusOK {
						t.Errorf("%s: %d answers %d, want every one 200", tenant, n, code)
					}
				}
			}
			long, short := st.Tenants["long"], st.Tenants["short"]
			wl, ws := weighted(long.PromptTokens, long.CompletionTokens), weighted(short.PromptTokens, short.CompletionTokens)
			share := wl / (wl + ws)
			t.Logf("%s: long %d requests %.0f weighted tokens, short %d requests %.0f: long's share %.3f; gap samples %d, max gap %.0f of bound %.0f",
				mode, long.Completed, wl, short.Completed, ws, share, gaps.n, gaps.maxGap, gaps.bound)
			switch mode {
			case policy.FairnessRequests:
				if share < 0.8 {
					t.Errorf("Requests mode: the long-prompt tenant got %.3f of the weighted tokens, want > 0.8 (served by age, about as many requests each)", share)
				}
			case policy.FairnessTokens:
				if share < 0.35 || share > 0.65 {
					t.Errorf("Tokens mode: the long-prompt tenant got %.3f of the weighted tokens, want about half (0.35..0.65)", share)
				}
				if gaps.n == 0 {
					t.Error("no fairness gap sampled while both tenants were backlogged")
				}
				// Both became backlogged together, so the counters stay
				// within the largest charge, a long request's cost (the
				// estimate is exact here: 4 bytes a token, as simserver
				// counts, and max_tokens is the output), which the
				// dispatcher reports as the bound.
				if want := float64(longPrompt + 2*output); gaps.bound != want {
					t.Errorf("reported fairness gap bound %.0f, want the long request's cost %.0f", gaps.bound, want)
				}
				if gaps.maxGap > gaps.bound {
					t.Errorf("fairness gap %.0f exceeded its bound %.0f", gaps.maxGap, gaps.bound)
				}
			}
		})
	}
}

type gapSamples struct {
	n             int
	maxGap, bound float64
}

// sampleGaps reads the tier's fairness gap and its bound from the
// dispatcher's stats every 100 ms until ctx ends.
func sampleGaps(ctx context.Context, t *testing.T, d *disp, tier string) gapSamples {
	t.Helper()
	var g gapSamples
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return g
		case <-tick.C:
		}
		ts, ok := d.stats(t).Queue.Tiers[tier]
		if !ok || ts.FairnessGapTokens == 0 {
			continue // fewer than two backlogged, or Requests mode
		}
		g.n++
		g.maxGap = max(g.maxGap, ts.FairnessGapTokens)
		g.bound = max(g.bound, ts.FairnessGapBoundTokens)
	}
}
