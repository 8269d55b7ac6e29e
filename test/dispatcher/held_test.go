package dispatcher

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// heldPolicy is basePolicy at zero replicas with a first replica 3s away:
// premium (W 5s) is refused at once (bound 0), standard holds 2 (one per
// tenant) and free 3.
func heldPolicy(version int64) *policy.Policy {
	p := basePolicy(version, 0)
	p.Backends = []policy.Backend{}
	p.ColdStartSeconds = 3
	p.ServiceRate = 2.0 / 3
	p.Tiers[0] = policyTier("premium", 0, 5, 0, 1, 1)
	p.Tiers[1] = policyTier("standard", 10, 20, 2, 1, 1)
	p.Tiers[2] = policyTier("free", 20, 60, 3, 1, 2)
	return p
}

// served is one held request's answer.
type served struct {
	name   string
	code   int
	waitMs int64
	sent   time.Time
	err    error
}

// A dispatcher at zero stays Ready and holds requests, from openai-go and
// plain HTTP clients, with no backend; premium, which cannot wait out the
// cold start, is refused at once with Retry-After = the cold start. The
// first policy with slots serves the held requests, and their
// X-Queue-Wait-Ms covers the time they were held.
func TestHeldAtZeroThenServedByTheFirstReplica(t *testing.T) {
	s := startSim(t, "--service-time", "const:50ms", "--concurrency", "4")
	d := startDispatcher(t, dispOpts{policy: heldPolicy(1)})
	testutil.WaitHTTP(t, d.Process, d.AdminURL("/readyz"), http.StatusOK, settle)

	r := d.fetch(context.Background(), t, call{tenant: "acme"})
	ref := testutil.ParseRefusal(t, []byte(r.body))
	got := [4]string{strconv.Itoa(r.code), r.header.Get("Retry-After"), ref.Error.Type, ref.Error.Tier}
	if diff := cmp.Diff([4]string{"503", "3", "unavailable", "premium"}, got); diff != "" {
		t.Errorf("premium at zero: status, Retry-After, type, tier (-want +got):\n%s\n%s", diff, r.body)
	}
	if want := `the pool is starting from zero replicas and its first replica takes 3s to become ready, longer than tier "premium" can wait, so the request is refused rather than held; retry after 3s`; ref.Error.Message != want || ref.Error.RetryAfterSeconds != 3 {
		t.Errorf("refusal body %+v, want message %q and retry_after_seconds 3", ref.Error, want)
	}

	results := make(chan served, 4)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // standard, through openai-go
		defer wg.Done()
		sent := time.Now()
		var resp *http.Response
		c := openaiClient("http://"+d.Data+"/v1", "initech", 0)
		_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
			Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
		}, option.WithResponseInto(&resp))
		res := served{name: "openai standard", sent: sent, err: err}
		if err == nil {
			res.code = resp.StatusCode
			res.waitMs, res.err = strconv.ParseInt(resp.Header.Get("X-Queue-Wait-Ms"), 10, 64)
		}
		results <- res
	}()
	for _, tenant := range []string{"u1", "u2", "u1"} { // free, the default tier
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			r := d.fetch(context.Background(), t, call{tenant: tenant})
			res := served{name: "free " + tenant, code: r.code, sent: sent, err: r.err}
			if r.err == nil && r.code == http.StatusOK {
				res.waitMs, res.err = strconv.ParseInt(r.header.Get("X-Queue-Wait-Ms"), 10, 64)
			}
			results <- res
		}()
	}
	testutil.EventuallyTrue(t, settle, "four requests held", func() bool { return d.stats(t).Queue.Queued == 4 })
	heldBy := time.Now() // every one of them was enqueued before this
	// Held requests are queued ones to every metric and to readiness.
	m := d.Metrics(t)
	for series, want := range map[string]float64{
		`tiergate_queue_length{pool="default/llm",tier="standard"}`:                        1,
		`tiergate_queue_length{pool="default/llm",tier="free"}`:                            3,
		`tiergate_queue_bound{pool="default/llm",tier="premium"}`:                          0,
		`tiergate_slots{pool="default/llm"}`:                                               0,
		`tiergate_rejections_total{cause="unavailable",pool="default/llm",tier="premium"}`: 1,
	} {
		if m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}
	if r := d.fetch(context.Background(), t, call{tenant: "u2"}); r.code != http.StatusTooManyRequests {
		t.Errorf("free past its bound of 3 at zero: %d, want 429\n%s", r.code, r.body)
	}
	if code, _ := d.AdminDo(t, http.MethodGet, "/readyz", "", nil); code != http.StatusOK {
		t.Errorf("/readyz while holding: %d, want 200", code)
	}

	firstAt := time.Now()
	d.MustPutPolicy(t, basePolicy(2, 2, s.Addr))
	wg.Wait()
	close(results)
	for res := range results {
		if res.err != nil || res.code != http.StatusOK {
			t.Errorf("%s: %d %v, want 200", res.name, res.code, res.err)
			continue
		}
		// Held at least from heldBy until the first policy came, and no
		// longer than the request took.
		if floor := firstAt.Sub(heldBy).Milliseconds(); res.waitMs < floor || res.waitMs > time.Since(res.sent).Milliseconds() {
			t.Errorf("%s: X-Queue-Wait-Ms %d, want from %d (held until the first replica) to the request's whole time", res.name, res.waitMs, floor)
		}
	}
	if n := d.Metrics(t)[`tiergate_queue_wait_seconds_count{pool="default/llm",tier="free"}`]; n != 3 {
		t.Errorf("free waits observed %v, want 3", n)
	}
}

// Held requests end as queued ones do: a client timeout expires them (504
// queue_timeout), and a drain refuses the rest (503 draining).
func TestHeldRequestsExpireAndDrain(t *testing.T) {
	p := heldPolicy(1)
	p.ClientTimeoutSeconds = 1
	d := startDispatcher(t, dispOpts{policy: p, args: []string{"--drain-timeout", "200ms"}})
	r := d.fetch(context.Background(), t, call{tenant: "u1"})
	if ref := testutil.ParseRefusal(t, []byte(r.body)); r.code != http.StatusGatewayTimeout || ref.Error.Type != "queue_timeout" {
		t.Fatalf("held past the client timeout: %d %s, want 504 queue_timeout", r.code, r.body)
	}

	p = heldPolicy(2) // no client timeout: held until the drain
	d.MustPutPolicy(t, p)
	done := make(chan result, 1)
	go func() { done <- d.fetch(context.Background(), t, call{tenant: "u2"}) }()
	testutil.EventuallyTrue(t, settle, "held", func() bool { return d.stats(t).Queue.Queued == 1 })
	if err := d.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r = <-done
	if ref := testutil.ParseRefusal(t, []byte(r.body)); r.code != http.StatusServiceUnavailable || ref.Error.Type != "draining" {
		t.Errorf("held at shutdown: %d %s, want 503 draining", r.code, r.body)
	}
	if exited, err := d.Wait(10 * time.Second); !exited || err != nil {
		t.Errorf("the dispatcher did not exit cleanly after the drain: exited %v, %v", exited, err)
	}
}
