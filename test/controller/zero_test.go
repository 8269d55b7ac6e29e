package controller

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// withColdStart adds spec.coldStart to the sample pool.
func withColdStart(d string) func(string) string {
	return func(s string) string {
		return strings.Replace(s, "  clientTimeout: 30s\n", "  clientTimeout: 30s\n  coldStart: "+d+"\n", 1)
	}
}

// The samples at zero replicas with a cold start of 12s: one replica
// serves μ₁ = 4/6s, so with the 30s client timeout premium (5s) gets 0,
// standard ⌊2/3 × 8s⌋ = 5 and free ⌊2/3 × 18s⌋ = 12, pool-wide. Two
// dispatchers each have half of the first replica's 4 slots: 0, 2 and 6,
// with tenant limits 1, slots 0, no backends and μ₁/2 as their rate.
func heldSamplePolicy(ns string) policy.Policy {
	p := samplePolicy(ns, []policy.Backend{}, 0, []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 0, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 2, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 6, TenantConcurrencyLimit: 1, TenantQueueLimit: 1},
	}, sampleTenants)
	p.ServiceRate = 2.0 / 6
	p.ColdStartSeconds = 12
	return p
}

func TestBoundsAtZeroFollowTheColdStart(t *testing.T) {
	e := newEnv(t)
	e.startDispatchers(2)
	e.applySamples(withColdStart("12s"))
	e.scale(0)

	// The real dispatchers accept the held policy and stay ready: their
	// /readyz, which a readiness probe reads, says so (kwok made the pods
	// Ready; it plays no probes).
	if took, err := allHold(e.disp, 5*time.Second, matches(heldSamplePolicy(e.ns))); err != nil {
		t.Fatalf("after %s the dispatchers do not hold the policy at zero: %v", took, err)
	}
	testutil.Eventually(t, 5*time.Second, "dispatchers ready at zero", func() error {
		for _, d := range e.disp {
			if code, body := readyz(t, d); code != http.StatusOK {
				return fmt.Errorf("%s /readyz %d %q", d.pod, code, body)
			}
			if ok, err := podIsReady(e.ns, d.pod); err != nil || !ok {
				return fmt.Errorf("%s Ready %v: %v", d.pod, ok, err)
			}
		}
		return nil
	})

	// Status and kubectl show the same numbers; maxWait includes the 12s.
	wantTiers := map[string]string{
		"premium":  "bound 0 maxWait - PoolNotReady",
		"standard": "bound 5 maxWait 1m43.5s HeldForColdStart",
		"free":     "bound 12 maxWait 2m43.5s HeldForColdStart",
	}
	testutil.Eventually(t, 5*time.Second, "ServiceTier status at zero", func() error {
		return tiersAre(e.ns, wantTiers)
	})
	// The pool's status is written up to 500 ms after it changed, and the
	// samples' tiers come after their pool: a status written in between
	// says the dispatchers hold up to 0 requests.
	testutil.Eventually(t, 5*time.Second, "ModelPool Ready condition at zero", func() error {
		conds := e.pool().Status.Conditions
		if err := conditionIs(conds, v1alpha1.ConditionReady, "False", string(v1alpha1.ReasonHeldForColdStart)); err != nil {
			return err
		}
		if msg := condition(conds, v1alpha1.ConditionReady).Message; !strings.Contains(msg, "hold up to 17 requests") || !strings.Contains(msg, "refuse tier premium at once") {
			return fmt.Errorf("Ready message %q does not state the 17 held requests and premium's refusal", msg)
		}
		return nil
	})
	out := kubectl.Must(t, "get", "servicetiers", "-n", e.ns, "-o", "custom-columns=NAME:.metadata.name,BOUND:.status.queueBound", "--no-headers", "--sort-by=.spec.basePriority")
	if diff := cmp.Diff("premium    0\nstandard   5\nfree       12\n", out); diff != "" {
		t.Errorf("kubectl get servicetiers (-want +got):\n%s", diff)
	}
	assertPrintedBound(t, kubectl.Must(t, "get", "servicetiers", "-n", e.ns), map[string]string{"premium": "0", "standard": "5", "free": "12"})

	// The first replica: ordinary bounds, no cold start in the policy.
	e.scale(1)
	if took, err := allHold(e.disp, 5*time.Second, func(p *policy.Policy) error {
		got := fmt.Sprintf("slots %d coldStart %v backends %d bounds %v", p.Slots, p.ColdStartSeconds, len(p.Backends), queueBounds(p))
		// R=1: P=4, μ=2/3; L 3/13/20, halved with the floor: 1/6/10.
		if want := "slots 2 coldStart 0 backends 1 bounds [1 6 10]"; got != want {
			return fmt.Errorf("%w: %s, want %s", errMismatch, got, want)
		}
		return nil
	}); err != nil {
		t.Fatalf("after %s the first replica's policy is not held: %v", took, err)
	}
}

func queueBounds(p *policy.Policy) []int {
	var out []int
	for _, pt := range p.Tiers {
		out = append(out, pt.QueueBound)
	}
	return out
}

// tiersAre compares each tier's bound, maxWait and Ready reason.
func tiersAre(ns string, want map[string]string) error {
	var tiers v1alpha1.ServiceTierList
	if err := k8s.List(context.Background(), &tiers, client.InNamespace(ns)); err != nil {
		return err
	}
	got := map[string]string{}
	for _, tr := range tiers.Items {
		wait := "-"
		if tr.Status.MaxWait != nil {
			wait = tr.Status.MaxWait.Duration.String()
		}
		reason := ""
		if c := condition(tr.Status.Conditions, v1alpha1.ConditionReady); c != nil {
			reason = c.Reason
		}
		got[tr.Name] = fmt.Sprintf("bound %d maxWait %s %s", tr.Status.QueueBound, wait, reason)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		return fmt.Errorf("tiers (-want +got):\n%s", diff)
	}
	return nil
}

// assertPrintedBound reads the BOUND column of `kubectl get servicetiers`.
func assertPrintedBound(t *testing.T, printed string, want map[string]string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(printed), "\n")
	header := strings.Fields(lines[0])
	col := -1
	for i, h := range header {
		if h == "BOUND" {
			col = i
		}
	}
	got := map[string]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if col >= 0 && col < len(f) {
			got[f[0]] = f[col]
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("BOUND column of kubectl get servicetiers (-want +got):\n%s\n%s", diff, printed)
	}
}
