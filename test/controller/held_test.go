package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"k8s.io/apimachinery/pkg/types"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// heldAnswer is what a held request's client finally got.
type heldAnswer struct {
	who    string
	tier   string
	code   int
	waitMs int64
	took   time.Duration
	err    error
}

// send posts one completion for tenant to d's data port and reports it.
func send(d *dispatcher, tenant, tier string, out chan<- heldAnswer) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, d.DataURL("/v1/completions"), strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
	req.Header.Set("X-Tenant-ID", tenant)
	a := heldAnswer{who: tenant + " via " + d.pod, tier: tier}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		a.code = resp.StatusCode
		a.waitMs, err = strconv.ParseInt(resp.Header.Get("X-Queue-Wait-Ms"), 10, 64)
	}
	a.err, a.took = err, time.Since(start)
	out <- a
}

// sendOpenAI is send through the openai-go client.
func sendOpenAI(d *dispatcher, tenant, tier string, out chan<- heldAnswer) {
	start := time.Now()
	c := openai.NewClient(option.WithBaseURL(d.DataURL("/v1/")), option.WithAPIKey("unused"),
		option.WithHeader("X-Tenant-ID", tenant), option.WithMaxRetries(0), option.WithRequestTimeout(time.Minute))
	var resp *http.Response
	_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	}, option.WithResponseInto(&resp))
	a := heldAnswer{who: tenant + " via openai-go to " + d.pod, tier: tier, err: err}
	if err == nil {
		a.code = resp.StatusCode
		a.waitMs, a.err = strconv.ParseInt(resp.Header.Get("X-Queue-Wait-Ms"), 10, 64)
	}
	a.took = time.Since(start)
	out <- a
}

// tierMaxWait reads a ServiceTier's stated maxWait.
func tierMaxWait(t *testing.T, ns, name string) time.Duration {
	t.Helper()
	var tr v1alpha1.ServiceTier
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &tr); err != nil {
		t.Fatal(err)
	}
	if tr.Status.MaxWait == nil {
		t.Fatalf("tier %s states no maxWait", name)
	}
	return tr.Status.MaxWait.Duration
}

// The whole scale-from-zero path on the real API server: a Deployment at
// 0 with coldStart 12s, two real dispatchers holding the controller's
// policy at zero, real clients (openai-go among them). Premium cannot wait
// 12s and is refused at once with Retry-After 12; the others are held.
// The controller computes desiredReplicas from the dispatchers' acks
// (their offered load: held requests and premium's refused demand) and
// exports it. Then the first replica starts (`kubectl scale` to 1: a pod
// kwok makes Ready, whose address the pod network relays to a simserver,
// and readyReplicas 1): the held requests are served, each having waited at
// least until the replica arrived, and within its tier's maxWait at zero.
func TestScaleFromZeroServesHeldRequests(t *testing.T) {
	e := newEnv(t)
	ds := e.startDispatchers(2)
	d0, d1 := ds[0], ds[1]
	// The first replica's model server (behind the pod network, which
	// serves a pod's address only once kwok made it Ready).
	e.serveModels("--concurrency", "4", "--service-time", "const:100ms")
	e.applySamples(withColdStart("12s"))
	e.scale(0)
	if took, err := allHold(e.disp, 10*time.Second, matches(heldSamplePolicy(e.ns))); err != nil {
		t.Fatalf("after %s the dispatchers do not hold the policy at zero: %v", took, err)
	}
	testutil.Eventually(t, 10*time.Second, "the ServiceTiers state their maxWait at zero", func() error {
		return tiersAre(e.ns, map[string]string{
			"premium":  "bound 0 maxWait - PoolNotReady",
			"standard": "bound 5 maxWait 1m43.5s HeldForColdStart",
			"free":     "bound 12 maxWait 2m43.5s HeldForColdStart",
		})
	})
	maxWait := map[string]time.Duration{"standard": tierMaxWait(t, e.ns, "standard"), "free": tierMaxWait(t, e.ns, "free")}

	// Premium is refused at once by either dispatcher.
	for _, d := range e.disp {
		req, _ := http.NewRequest(http.MethodPost, d.DataURL("/v1/completions"), strings.NewReader(`{"model":"m","prompt":"hi"}`))
		req.Header.Set("X-Tenant-ID", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ref := testutil.ParseRefusal(t, body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "12" || ref.Error.Type != "unavailable" || ref.Error.RetryAfterSeconds != 12 {
			t.Errorf("premium at zero on %s: %d Retry-After %q %s, want 503 unavailable after 12s", d.pod, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}

	// Four requests held: standard (openai-go) and two free on
	// dispatcher-0, one free on dispatcher-1.
	answers := make(chan heldAnswer, 4)
	var wg sync.WaitGroup
	for _, f := range []func(){
		func() { sendOpenAI(d0, "globex", "standard", answers) },
		func() { send(d0, "initech", "free", answers) },
		func() { send(d0, "u1", "free", answers) },
		func() { send(d1, "u3", "free", answers) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	testutil.Eventually(t, 10*time.Second, "four requests held", func() error {
		var q [2]int
		for i, d := range []*dispatcher{d0, d1} {
			var s struct {
				Queue struct{ Queued, Slots int }
			}
			d.Stats(t, &s)
			q[i] = s.Queue.Queued
		}
		if q != [2]int{3, 1} {
			return fmt.Errorf("held %v, want [3 1]", q)
		}
		return nil
	})
	heldBy := time.Now()

	// Premium's refused demand is offered load too: 40 more of them make
	// the acks ask for more than the one replica the held requests need.
	for range 40 {
		req, _ := http.NewRequest(http.MethodPost, d1.DataURL("/v1/completions"), strings.NewReader(`{}`))
		req.Header.Set("X-Tenant-ID", "acme")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	pool := e.ns + "/llm"
	var desired int32
	testutil.Eventually(t, 10*time.Second, "desiredReplicas from the acks", func() error {
		desired = e.pool().Status.DesiredReplicas
		if desired < 2 {
			return fmt.Errorf("status.desiredReplicas %d, want at least 2 from the offered load", desired)
		}
		want := fmt.Sprintf(`tiergate_pool_desired_replicas{pool="%s"} %d`, pool, desired)
		if got := controllerSeries(t, "tiergate_pool_desired_replicas", pool); len(got) != 1 || got[0] != want {
			return fmt.Errorf("exported %q, want %q", got, want)
		}
		return hasEvent(e.ns, "llm", "Normal", "DesiredReplicas", "4 queued or held")
	})
	t.Logf("desiredReplicas %d while 4 requests are held and premium is refused", desired)

	// The first replica arrives.
	replicaAt := time.Now()
	e.scale(1)
	if took, err := allHold(e.disp, 10*time.Second, func(p *policy.Policy) error {
		if p.Slots != 2 || p.ColdStartSeconds != 0 || len(p.Backends) != 1 {
			return fmt.Errorf("%w: slots %d coldStart %v backends %d", errMismatch, p.Slots, p.ColdStartSeconds, len(p.Backends))
		}
		return nil
	}); err != nil {
		t.Fatalf("after %s the first replica's policy is not held: %v", took, err)
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.err != nil || a.code != http.StatusOK {
			t.Errorf("%s: %d %v, want 200", a.who, a.code, a.err)
			continue
		}
		wait := time.Duration(a.waitMs) * time.Millisecond
		t.Logf("%s (%s): held %s, stated maxWait at zero %s", a.who, a.tier, wait, maxWait[a.tier])
		if floor := replicaAt.Sub(heldBy); wait < floor || wait > a.took {
			t.Errorf("%s: X-Queue-Wait-Ms %s, want at least %s (until the replica arrived) and at most the request's %s", a.who, wait, floor, a.took)
		}
		if wait > maxWait[a.tier] {
			t.Errorf("%s: held %s, beyond tier %s's stated maxWait at zero %s", a.who, wait, a.tier, maxWait[a.tier])
		}
	}
}

// Status, kubectl's printer columns and `tiergate simulate` show the same
// numbers at zero: the samples with coldStart 12s on the real API server,
// and the same files through the simulator with a replica change to 0.
func TestSimulateShowsTheStatusAtZero(t *testing.T) {
	e := newEnv(t)
	e.startDispatchers(1)
	e.applySamples(withColdStart("12s"))
	e.scale(0)
	testutil.Eventually(t, 10*time.Second, "ServiceTier status at zero", func() error {
		return tiersAre(e.ns, map[string]string{
			"premium":  "bound 0 maxWait - PoolNotReady",
			"standard": "bound 5 maxWait 1m43.5s HeldForColdStart",
			"free":     "bound 12 maxWait 2m43.5s HeldForColdStart",
		})
	})
	printed := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(kubectl.Must(t, "get", "servicetiers", "-n", e.ns,
		"-o", "custom-columns=NAME:.metadata.name,BOUND:.status.queueBound,MAXWAIT:.status.maxWait", "--no-headers")), "\n") {
		f := strings.Fields(l)
		printed[f[0]] = strings.Join(f[1:], " ")
	}
	assertPrintedBound(t, kubectl.Must(t, "get", "servicetiers", "-n", e.ns), map[string]string{"premium": "0", "standard": "5", "free": "12"})

	dir := t.TempDir()
	var files []string
	for _, name := range []string{"tiergate_v1alpha1_modelpool.yaml", "tiergate_v1alpha1_servicetier.yaml", "tiergate_v1alpha1_tenantquota.yaml"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", name))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.Join(dir, name))
		if err := os.WriteFile(files[len(files)-1], []byte(withColdStart("12s")(string(b))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	load := filepath.Join(dir, "load.yaml")
	if err := os.WriteFile(load, []byte(`apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 6
  replicaChanges: [{at: 30s, replicas: 0}, {at: 42s, replicas: 1}]
  duration: 60s
  tenants:
  - {tenant: acme, arrival: {process: poisson, rate: 0.5}}
  - {tenant: someone, arrival: {process: poisson, rate: 0.5}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"simulate", "--json"}
	for _, f := range append(files, load) {
		args = append(args, "-f", f)
	}
	r := testutil.Tool{Bin: bins.Tiergate}.Run(args...)
	if r.Err != nil {
		t.Fatal(r)
	}
	var res struct {
		PolicyChanges []struct {
			Replicas      int32              `json:"replicas"`
			Bounds        map[string]int     `json:"bounds"`
			MaxWait       map[string]float64 `json:"maxWait"`
			RefusedAtZero []string           `json:"refusedAtZero"`
		} `json:"policyChanges"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil || len(res.PolicyChanges) == 0 || res.PolicyChanges[0].Replicas != 0 {
		t.Fatalf("simulate's policy changes: %v\n%s", err, r.Stdout)
	}
	zero := res.PolicyChanges[0]
	simulated := map[string]string{}
	for name, b := range zero.Bounds {
		wait := "<none>"
		if mw, ok := zero.MaxWait[name]; ok {
			wait = (time.Duration(mw * float64(time.Second))).String()
		}
		simulated[name] = fmt.Sprintf("%d %s", b, wait)
	}
	if diff := cmp.Diff(printed, simulated); diff != "" {
		t.Errorf("kubectl (-) and tiergate simulate (+) at zero differ:\n%s", diff)
	}
	if diff := cmp.Diff([]string{"premium"}, zero.RefusedAtZero); diff != "" {
		t.Errorf("refused at zero (-want +got):\n%s", diff)
	}
}
