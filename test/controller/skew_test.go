package controller

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// skewBaseRev is the last commit before the policy had a schema revision:
// its dispatcher is at revision 0 and refuses every field it does not know,
// schemaVersion included.
const skewBaseRev = "29c89b6"

// oldTiergate builds tiergate at rev (git archive + go build, as
// hack/bench-dispatcher.sh's BENCH_BEFORE_REV does) and returns the
// binary, cached by commit under the user's cache directory so a rerun
// does not build it again.
func oldTiergate(t *testing.T, rev string) string {
	t.Helper()
	sha := strings.TrimSpace(mustRun(t, repoRoot, nil, "git", "rev-parse", "--verify", rev+"^{commit}"))
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "tiergate-test", "tiergate-"+sha)
	bin := filepath.Join(dir, "tiergate")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	// Build beside the cache entry and rename it in, so a cut-off build
	// never leaves a half-written binary behind.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp(filepath.Dir(dir), "build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := mustRun(t, repoRoot, nil, "git", "archive", sha)
	mustRun(t, src, strings.NewReader(archive), "tar", "-x")
	out := filepath.Join(work, "out")
	if err := testutil.BuildBinary(src, filepath.Join(out, "tiergate"), ".", testutil.BuildOptions{Env: []string{"GOWORK=off"}}); err != nil {
		t.Fatalf("building tiergate at %s: %v", rev, err)
	}
	if err := os.Rename(out, dir); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	return bin
}

func mustRun(t *testing.T, dir string, stdin *strings.Reader, argv ...string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, errb.String())
	}
	return out.String()
}

// schemaHeader is what d's admin API says its schema revision is.
func schemaHeader(t *testing.T, d *dispatcher) string {
	t.Helper()
	resp, err := http.Get(d.AdminURL("/healthz"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get(policy.SchemaHeader)
}

// skewHold accepts a policy of version > after whose slots and premium
// tier are these, at the schema revision its dispatcher declared.
func skewHold(after int64, slots, premiumBound int, premiumWait float64, revisions map[string]int) func(*dispatcher, *policy.Policy) error {
	return func(d *dispatcher, p *policy.Policy) error {
		var premium policy.Tier
		for _, tr := range p.Tiers {
			if tr.Name == "premium" {
				premium = tr
			}
		}
		switch {
		case p.Version <= after:
			return fmt.Errorf("version %d, want > %d", p.Version, after)
		case p.Slots != slots || len(p.Backends) == 0:
			return fmt.Errorf("slots %d with %d backends, want %d", p.Slots, len(p.Backends), slots)
		case premium.QueueBound != premiumBound || premium.TolerableWaitSeconds != premiumWait:
			return fmt.Errorf("premium %+v, want queueBound %d, tolerableWaitSeconds %v", premium, premiumBound, premiumWait)
		case p.SchemaVersion != revisions[d.pod]:
			return fmt.Errorf("schemaVersion %d, want %d, the revision the pod declares: "+
				"the controller does not yet write each pod the policy at its own revision (policy.At)", p.SchemaVersion, revisions[d.pod])
		}
		return nil
	}
}

// holdAll waits until every dispatcher of ds holds a policy that check
// accepts, and returns the newest version they hold.
func holdAll(t *testing.T, ds []*dispatcher, what string, check func(*dispatcher, *policy.Policy) error) int64 {
	t.Helper()
	var version int64
	start := time.Now()
	err := testutil.Poll(10*time.Second, func() error {
		version = 0
		for _, d := range ds {
			p, err := getPolicy(d)
			if err != nil {
				return err
			}
			if err := check(d, p); err != nil {
				return fmt.Errorf("%s: %w", d.pod, err)
			}
			version = max(version, p.Version)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: after %s: %v\n--- controller log ---\n%s", what, time.Since(start).Round(time.Millisecond), err, ctrlProc.tail(30))
	}
	return version
}

// TestSkewOlderDispatcherKeepsReceivingPolicies runs a dispatcher built at
// skewBaseRev beside a current one under the current controller: through a
// policy change and a scale both must hold each new version with their
// slots, each at the schema revision it declares, and the pool's
// DispatcherSkew condition must name the older pod (and only it).
func TestSkewOlderDispatcherKeepsReceivingPolicies(t *testing.T) {
	old := oldTiergate(t, skewBaseRev)
	e := newEnv(t)
	// The current binary on the pod the controller ranks first, as the
	// newer pod would be.
	pods := e.dispatcherPods(2)
	oldD := e.adopt(pods[1], old, pushToken)
	newD := e.adopt(pods[0], bins.Tiergate, pushToken)
	if got, want := []string{schemaHeader(t, oldD), schemaHeader(t, newD)}, []string{"", fmt.Sprint(policy.SchemaVersion)}; got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("%s headers of the old and the new dispatcher: %q, want %q", policy.SchemaHeader, got, want)
	}
	revisions := map[string]int{oldD.pod: 0, newD.pod: policy.SchemaVersion}
	e.applySamples()
	e.scale(6)

	hold := func(what string, check func(*dispatcher, *policy.Policy) error) int64 {
		t.Helper()
		return holdAll(t, e.disp, what, check)
	}
	// Two dispatchers at R=6 (P=24, μ=4/s): 12 slots each, premium
	// L = 5s·4/s = 20, 10 each.
	v := hold("the samples", skewHold(0, 12, 10, 5, revisions))

	// A policy change: premium may wait 10s, L = 40, 20 each.
	kubectl.Must(t, "patch", "-n", e.ns, "servicetier", "premium", "--type=merge", "-p", `{"spec":{"tolerableWait":"10s"}}`)
	v = hold("premium's new tolerableWait", skewHold(v, 12, 20, 10, revisions))

	// A scale to R=3 (P=12, μ=2/s): 6 slots each, premium L = 20, 10 each.
	e.scale(3)
	hold("the scale to 3 replicas", skewHold(v, 6, 10, 10, revisions))

	testutil.Eventually(t, 10*time.Second, "DispatcherSkew names the old pod", func() error {
		conds := e.pool().Status.Conditions
		if err := conditionIs(conds, v1alpha1.ModelPoolDispatcherSkew, metav1.ConditionTrue, string(v1alpha1.ReasonOlderDispatchers)); err != nil {
			return fmt.Errorf("%w (the controller does not set DispatcherSkew yet?)", err)
		}
		msg := condition(conds, v1alpha1.ModelPoolDispatcherSkew).Message
		if !strings.Contains(msg, oldD.pod+" (revision 0)") || strings.Contains(msg, newD.pod) {
			return fmt.Errorf("DispatcherSkew message %q, want it to name %s (revision 0) and not %s", msg, oldD.pod, newD.pod)
		}
		return nil
	})
	// The old dispatcher refused at most the first push, the one at the
	// controller's revision before its own was known (its 400 names no
	// revision, so it is pushed again at revision 0); never a later one.
	if n := strings.Count(oldD.Output(), "refused an invalid policy"); n > 1 {
		t.Errorf("the old dispatcher refused %d pushes, want at most the first:\n%s", n, testutil.LastLines(oldD.Output(), 20))
	}
}

// skewPrevRev is the last commit of policy schema revision 1, the parent
// of the commit that brought revision 2 (the token budgets): its
// dispatcher is one release older than the current one. It sends the
// schema header and refuses, as unknown, every field of revision 2.
const skewPrevRev = "228996e"

// budgetHold is skewHold for the budgets: besides the slots and the
// premium tier, a current dispatcher must hold acme's and premium's
// budgets as given (nil: none) and one of an older revision none.
func budgetHold(after int64, revisions map[string]int, acme, premium *policy.Limits) func(*dispatcher, *policy.Policy) error {
	base := skewHold(after, 12, 10, 5, revisions)
	return func(d *dispatcher, p *policy.Policy) error {
		if err := base(d, p); err != nil {
			return err
		}
		wantAcme, wantPremium := acme, premium
		if revisions[d.pod] < 2 {
			wantAcme, wantPremium = nil, nil
		}
		var gotAcme, gotPremium *policy.Limits
		for _, tn := range p.Tenants {
			if tn.ID == "acme" {
				gotAcme = tn.Limits
			}
		}
		for _, tr := range p.Tiers {
			if tr.Name == "premium" {
				gotPremium = tr.TenantLimits
			}
		}
		if diff := cmp.Diff(wantAcme, gotAcme); diff != "" {
			return fmt.Errorf("acme's limits (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(wantPremium, gotPremium); diff != "" {
			return fmt.Errorf("premium's tenantLimits (-want +got):\n%s", diff)
		}
		return nil
	}
}

// TestSkewBudgetsOnAnOlderDispatcher runs a dispatcher of schema revision
// 1 (built at skewPrevRev) beside a current one. Once a TenantQuota and
// its tier have budgets, the older one keeps taking each new policy,
// without the budgets (its strict decoder would refuse them), the current
// one holds its part of them, DispatcherSkew says FeaturesNotEnforced
// naming the fields and the older pod, with a Warning event, and the
// quota's status shows the budgets and their split. Budgets removed, the
// condition is OlderDispatchers again; the older pod replaced by a
// current one, DispatchersCurrent.
func TestSkewBudgetsOnAnOlderDispatcher(t *testing.T) {
	old := oldTiergate(t, skewPrevRev)
	e := newEnv(t)
	// The current binary on the pod the controller ranks first, as the
	// newer pod would be.
	pods := e.dispatcherPods(2)
	oldD := e.adopt(pods[1], old, pushToken)
	newD := e.adopt(pods[0], bins.Tiergate, pushToken)
	if got, want := []string{schemaHeader(t, oldD), schemaHeader(t, newD)}, []string{"1", fmt.Sprint(policy.SchemaVersion)}; got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("%s headers of the old and the new dispatcher: %q, want %q", policy.SchemaHeader, got, want)
	}
	revisions := map[string]int{oldD.pod: 1, newD.pod: policy.SchemaVersion}
	e.applySamples()
	e.scale(6)
	skewIs := func(what string, reason v1alpha1.ModelPoolReason, status metav1.ConditionStatus, contains []string, lacks ...string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, what, func() error {
			conds := e.pool().Status.Conditions
			if err := conditionIs(conds, v1alpha1.ModelPoolDispatcherSkew, status, string(reason)); err != nil {
				return err
			}
			msg := condition(conds, v1alpha1.ModelPoolDispatcherSkew).Message
			for _, s := range contains {
				if !strings.Contains(msg, s) {
					return fmt.Errorf("DispatcherSkew message %q lacks %q", msg, s)
				}
			}
			for _, s := range lacks {
				if strings.Contains(msg, s) {
					return fmt.Errorf("DispatcherSkew message %q names %q", msg, s)
				}
			}
			return nil
		})
	}

	// Two dispatchers at R=6: 12 slots each, premium's bound 10 each.
	v := holdAll(t, e.disp, "the samples", budgetHold(0, revisions, nil, nil))
	skewIs("no budgets: the older pod is named, nothing is lost", v1alpha1.ReasonOlderDispatchers, metav1.ConditionTrue,
		[]string{oldD.pod + " (revision 1)", "no feature in use is left out"}, newD.pod)

	// premium's tenants 600 requests per minute, acme 60001 tokens of its
	// own: each dispatcher serves, so each gets half, and the first
	// (dispatcher-new: newest, then by name) the odd token.
	kubectl.Must(t, "patch", "-n", e.ns, "servicetier", "premium", "--type=merge", "-p", `{"spec":{"tenantLimits":{"requestsPerMinute":600}}}`)
	kubectl.Must(t, "patch", "-n", e.ns, "tenantquota", "acme", "--type=merge", "-p", `{"spec":{"limits":{"tokensPerMinute":60001}}}`)
	v = holdAll(t, e.disp, "the budgets", budgetHold(v, revisions,
		&policy.Limits{TokensPerMinute: 30001}, &policy.Limits{RequestsPerMinute: 300}))
	skewIs("budgets in use: FeaturesNotEnforced names the fields and the older pod", v1alpha1.ReasonFeaturesNotEnforced, metav1.ConditionTrue,
		[]string{"which they cannot enforce: " + oldD.pod + ": tiers[].tenantLimits, tenants[].limits"}, newD.pod)
	testutil.Eventually(t, 5*time.Second, "a Warning event FeaturesNotEnforced", func() error {
		return hasEvent(e.ns, "llm", corev1.EventTypeWarning, string(v1alpha1.ReasonFeaturesNotEnforced),
			"(they read an older policy schema; upgrade them): "+oldD.pod+": ")
	})
	testutil.Eventually(t, 15*time.Second, "acme's status.limits", func() error {
		want := &v1alpha1.LimitsStatus{RequestsPerMinute: 600, TokensPerMinute: 60001, Source: v1alpha1.LimitsFromBoth,
			PerDispatcher: &v1alpha1.LimitsSplit{Dispatchers: 2, RequestsPerMinute: &v1alpha1.BudgetRange{Min: 300, Max: 300},
				TokensPerMinute: &v1alpha1.BudgetRange{Min: 30000, Max: 30001}}}
		var q v1alpha1.TenantQuota
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "acme"}, &q); err != nil {
			return err
		}
		if diff := cmp.Diff(want, q.Status.Limits); diff != "" {
			return fmt.Errorf("status.limits (-want +got):\n%s", diff)
		}
		return nil
	})

	// The budgets removed: nothing is lost any more.
	kubectl.Must(t, "patch", "-n", e.ns, "tenantquota", "acme", "--type=merge", "-p", `{"spec":{"limits":null}}`)
	kubectl.Must(t, "patch", "-n", e.ns, "servicetier", "premium", "--type=merge", "-p", `{"spec":{"tenantLimits":null}}`)
	holdAll(t, e.disp, "the budgets removed", budgetHold(v, revisions, nil, nil))
	skewIs("budgets removed: OlderDispatchers", v1alpha1.ReasonOlderDispatchers, metav1.ConditionTrue,
		[]string{oldD.pod + " (revision 1)"}, newD.pod)
	// The older dispatcher refused at most the first push, made at this
	// controller's revision before its own was known; none at its own.
	if n := strings.Count(oldD.Output(), "refused an invalid policy"); n > 1 {
		t.Errorf("the older dispatcher refused %d pushes, want at most the first:\n%s", n, testutil.LastLines(oldD.Output(), 20))
	}

	// The older pod replaced by a current one.
	// Its pod deleted, the ReplicaSet controller makes another, on which the
	// current binary runs.
	oldD.Stop(10 * time.Second)
	kubectl.Must(t, "delete", "-n", e.ns, "pod", oldD.pod, "--wait=false")
	up := e.adopt(e.newDispatcherPods(2)[0], bins.Tiergate, pushToken)
	revisions[up.pod] = policy.SchemaVersion
	holdAll(t, []*dispatcher{newD, up}, "the upgraded pod", budgetHold(v, revisions, nil, nil))
	skewIs("every pod current: DispatchersCurrent", v1alpha1.ReasonDispatchersCurrent, metav1.ConditionFalse, nil, oldD.pod)
}
