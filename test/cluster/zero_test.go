package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// zeroColdStart is the pool's spec.coldStart in TestScaleFromZero and the
// cold start of its pods (their template's annotation, which the
// pod-ready Stage reads).
const zeroColdStart = 10 * time.Second

// heldTenants are the tenants whose requests are held at zero, one each
// per dispatcher: globex of tier standard, initech of free, and walk-in-1
// of the default tier (free).
var heldTenants = []string{"globex", "initech", "walk-in-1"}

// TestScaleFromZero: the pool of config/samples with `coldStart: 10s` is
// scaled 6 -> 0 with kubectl. Every dispatcher then holds the policy at
// zero: no slot, no backend, coldStartSeconds 10, and the bounds
// docs/autoscaling.md gives for a 10s cold start (C = 4, S = 6s, so
// μ₁ = 2/3 req/s): premium (W 5s) 0, standard (W 20s) ⌊2/3 × 10s⌋ = 6,
// free (W 60s, capped by the 30s client timeout) ⌊2/3 × 20s⌋ = 13 in the
// tiers' status, and half of each (floored) on each dispatcher, which has
// 2 of the first replica's 4 slots; the pool's Ready condition is
// False/HeldForColdStart. A premium request is refused at once with 503
// unavailable and Retry-After 10; standard and free requests are held.
// Then `kubectl scale --replicas=6` makes pods whose cold start is 10s:
// every held request is answered 200 no sooner than the cold start after
// the scale, its X-Queue-Wait-Ms is at least the cold start, and it is
// answered within heldSlack of the cold start.
func TestScaleFromZero(t *testing.T) {
	p := startPool(t, withPoolField("coldStart: "+zeroColdStart.String()))

	down := startStep(t)
	kubectl.Must(t, "scale", "-n", p.ns, "deployment/llm", "--replicas=0")
	await(t, 30*time.Second, "every dispatcher holding the policy at zero", func() (bool, string) {
		var why []string
		ok := true
		for _, pol := range p.policies(t) {
			why = append(why, describePolicy(pol))
			ok = ok && pol.Slots == 0 && len(pol.Backends) == 0 && pol.ColdStartSeconds == zeroColdStart.Seconds()
		}
		return ok, strings.Join(why, "; ")
	})
	down.done("scale 6->0: every dispatcher holds 0 slots for a 10s cold start")
	checkBoundsAtZero(t, p.ns, p.policies(t))
	await(t, 10*time.Second, "the pool's Ready condition at zero", func() (bool, string) {
		mp := p.pool(t)
		return readyCondition(mp) == "False/HeldForColdStart" && mp.Status.ReadyReplicas == 0, fmt.Sprintf("Ready %s, readyReplicas %d", readyCondition(mp), mp.Status.ReadyReplicas)
	})
	awaitPods(t, p.ns, "the model pods gone", func(pods []corev1.Pod) bool { return len(pods) == 0 })
	// The next pods take the pool's cold start to become Ready. At zero
	// replicas the new template rolls out to no pod.
	kubectl.Must(t, "patch", "-n", p.ns, "deployment/llm", "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{%q:%q}}}}}`, cluster.ColdStartAnnotation, zeroColdStart.String()))

	for i, d := range p.ds {
		checkPremiumRefusedAtZero(t, i, d)
	}
	held := holdRequests(t, p.ds)
	testutil.Eventually(t, 10*time.Second, "the held requests queued", func() error {
		if n := queued(t, p.ds); n != len(held.want) {
			return fmt.Errorf("%d requests queued over the dispatchers, want %d", n, len(held.want))
		}
		return nil
	})
	if n := held.answered(); n != 0 {
		t.Fatalf("%d requests sent at zero were answered before the scale", n)
	}

	up := startStep(t)
	scaledAt := time.Now()
	kubectl.Must(t, "scale", "-n", p.ns, "deployment/llm", "--replicas=6")
	up.done("kubectl scale to 6 returned")
	results := held.wait(t, 45*time.Second)
	up.done(fmt.Sprintf("%d held requests answered", len(results)))
	awaitFollow(t, p.ns, p.w, 6, 30*time.Second)
	up.done("6 pods Ready; pool and dispatchers hold 6 x 4 slots")
	checkHeldAnswers(t, results, scaledAt)
	checkFirstSlots(t, p.logs(t), scaledAt)
	checkAppliesWithinBackends(t, p.logs(t))
	checkControllerQuiet(t, p.ns, p.ctl.Output())
}

// boundsAtZero are the tiers' pool-wide bounds for a 10s cold start
// (docs/autoscaling.md's formula): premium's 5s wait is shorter than the
// cold start; standard ⌊2/3 × (20s − 10s)⌋; free ⌊2/3 × (30s − 10s)⌋.
var boundsAtZero = map[string]int{"premium": 0, "standard": 6, "free": 13}

// checkBoundsAtZero: the ServiceTiers' status bounds are boundsAtZero, and
// each of the 2 dispatchers, with 2 of the first replica's 4 slots, holds
// ⌊bound × 2/4⌋ of them, enough for what holdRequests sends it.
func checkBoundsAtZero(t *testing.T, ns string, pols []*policy.Policy) {
	t.Helper()
	await(t, 10*time.Second, "the tiers' bounds at zero in their status", func() (bool, string) {
		var tiers v1alpha1.ServiceTierList
		if err := k8s.List(context.Background(), &tiers, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		got := map[string]int{}
		for _, tr := range tiers.Items {
			got[tr.Name] = int(tr.Status.QueueBound)
		}
		diff := cmp.Diff(boundsAtZero, got)
		return diff == "", "status bounds (-want +got):\n" + diff
	})
	for i, pol := range pols {
		got, want := map[string]int{}, map[string]int{}
		for name, n := range boundsAtZero {
			got[name], want[name] = tierOf(t, pol, name).QueueBound, n/2
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("dispatcher %d's bounds at zero (-want +got):\n%s", i, diff)
		}
		std, free := tierOf(t, pol, "standard"), tierOf(t, pol, "free")
		if std.TenantQueueLimit < 1 || free.TenantQueueLimit < 1 {
			t.Fatalf("dispatcher %d cannot hold a request of every tenant at zero: %s", i, describePolicy(pol))
		}
	}
}

// completionBody is a small completion request.
func completionBody(t *testing.T) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": "sim-model", "prompt": "hi", "max_tokens": 2})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkPremiumRefusedAtZero: a premium request (acme) gets, at once, 503
// unavailable with Retry-After the cold start and the message of
// docs/autoscaling.md.
func checkPremiumRefusedAtZero(t *testing.T, i int, d *testutil.Dispatcher) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.DataURL("/v1/completions"), bytes.NewReader(completionBody(t)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", "acme")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(sent)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "10" || resp.Header.Get("X-Tier") != "premium" {
		t.Fatalf("dispatcher %d: premium at zero: %s, Retry-After %q, X-Tier %q: %s", i, resp.Status, resp.Header.Get("Retry-After"), resp.Header.Get("X-Tier"), body)
	}
	if took > time.Second {
		t.Errorf("dispatcher %d refused premium after %s, not at once", i, took.Round(time.Millisecond))
	}
	got := testutil.ParseRefusal(t, body).Error
	want := testutil.Refusal{}.Error
	want.Type, want.Tier, want.RetryAfterSeconds = "unavailable", "premium", 10
	want.Message = `the pool is starting from zero replicas and its first replica takes 10s to become ready, longer than tier "premium" can wait, so the request is refused rather than held; retry after 10s`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dispatcher %d: premium refusal at zero (-want +got):\n%s", i, diff)
	}
}

// heldAnswer is one request sent at zero.
type heldAnswer struct {
	dispatcher int
	tenant     string
	sent, end  time.Time
	err        error
	// queueWait is its X-Queue-Wait-Ms.
	queueWait time.Duration
}

// heldRequests are the requests sent at zero, answered as they come.
type heldRequests struct {
	want []heldAnswer
	ch   chan heldAnswer
	got  []heldAnswer
}

// holdRequests sends one completion per heldTenants to each dispatcher
// with openai-go, each from a goroutine of its own.
func holdRequests(t *testing.T, ds []*testutil.Dispatcher) *heldRequests {
	t.Helper()
	h := &heldRequests{ch: make(chan heldAnswer, len(ds)*len(heldTenants))}
	for i, d := range ds {
		for _, tenant := range heldTenants {
			a := heldAnswer{dispatcher: i, tenant: tenant}
			h.want = append(h.want, a)
			c := openai.NewClient(option.WithBaseURL("http://"+d.Data+"/v1"), option.WithAPIKey("unused"),
				option.WithHeader("X-Tenant-ID", tenant), option.WithMaxRetries(0), option.WithRequestTimeout(40*time.Second))
			go func() {
				var raw *http.Response
				a.sent = time.Now()
				_, a.err = c.Completions.New(context.Background(), openai.CompletionNewParams{
					Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
				}, option.WithResponseInto(&raw))
				a.end = time.Now()
				if raw != nil {
					if ms, err := strconv.Atoi(raw.Header.Get(apierror.HeaderQueueWaitMs)); err == nil {
						a.queueWait = time.Duration(ms) * time.Millisecond
					}
				}
				h.ch <- a
			}()
		}
	}
	return h
}

// answered is how many have been answered so far (without waiting).
func (h *heldRequests) answered() int {
	for {
		select {
		case a := <-h.ch:
			h.got = append(h.got, a)
		default:
			return len(h.got)
		}
	}
}

// wait waits for every answer.
func (h *heldRequests) wait(t *testing.T, timeout time.Duration) []heldAnswer {
	t.Helper()
	deadline := time.After(timeout)
	for len(h.got) < len(h.want) {
		select {
		case a := <-h.ch:
			h.got = append(h.got, a)
		case <-deadline:
			t.Fatalf("%d of %d requests sent at zero unanswered after %s", len(h.want)-len(h.got), len(h.want), timeout)
		}
	}
	return h.got
}

// queued are the requests the dispatchers' queues hold now.
func queued(t *testing.T, ds []*testutil.Dispatcher) int {
	t.Helper()
	n := 0.0
	for _, d := range ds {
		for k, v := range d.Metrics(t) {
			if strings.HasPrefix(k, "tiergate_queue_length{") {
				n += v
			}
		}
	}
	return int(n)
}

// heldSlack is how long after the cold start a held request may take:
// the scheduler, the Ready pod reaching the controller and its push.
const heldSlack = 3 * time.Second

// checkHeldAnswers: every held request was answered 200 between the cold
// start and the cold start plus heldSlack after the scale, having waited
// in the queue at least the cold start.
func checkHeldAnswers(t *testing.T, results []heldAnswer, scaledAt time.Time) {
	t.Helper()
	var first heldAnswer
	for _, a := range results {
		after := a.end.Sub(scaledAt)
		switch {
		case a.err != nil:
			t.Errorf("dispatcher %d, %s: the request held at zero failed: %v", a.dispatcher, a.tenant, a.err)
			continue
		case after < zeroColdStart || after > zeroColdStart+heldSlack:
			t.Errorf("dispatcher %d, %s: answered %s after the scale, want within [%s, %s]", a.dispatcher, a.tenant, after.Round(time.Millisecond), zeroColdStart, zeroColdStart+heldSlack)
		case a.queueWait < zeroColdStart || a.queueWait > a.end.Sub(a.sent):
			t.Errorf("dispatcher %d, %s: X-Queue-Wait-Ms %s, want at least the %s cold start and at most the %s the client waited", a.dispatcher, a.tenant, a.queueWait, zeroColdStart, a.end.Sub(a.sent).Round(time.Millisecond))
		}
		if first.sent.IsZero() || a.sent.Before(first.sent) {
			first = a
		}
	}
	t.Logf("first request sent at zero (%s via dispatcher %d): held %s before the scale, answered %s after it, %s in all (X-Queue-Wait-Ms %s) against a %s cold start",
		first.tenant, first.dispatcher, scaledAt.Sub(first.sent).Round(time.Millisecond), first.end.Sub(scaledAt).Round(time.Millisecond),
		first.end.Sub(first.sent).Round(time.Millisecond), first.queueWait, zeroColdStart)
}

// checkFirstSlots logs when each dispatcher applied its first policy with
// slots after the scale, which must be no sooner than the cold start.
func checkFirstSlots(t *testing.T, logs [][]applied, scaledAt time.Time) {
	t.Helper()
	for i, log := range logs {
		for _, a := range log {
			if a.at.Before(scaledAt) || a.slots == 0 {
				continue
			}
			after := a.at.Sub(scaledAt)
			if after < zeroColdStart {
				t.Errorf("dispatcher %d applied v%d with %d slots %s after the scale, before the %s cold start", i, a.version, a.slots, after.Round(time.Millisecond), zeroColdStart)
			}
			t.Logf("dispatcher %d: first policy with slots (v%d, %d slots, %d backends) applied %s after the scale", i, a.version, a.slots, a.backends, after.Round(time.Millisecond))
			break
		}
	}
}
