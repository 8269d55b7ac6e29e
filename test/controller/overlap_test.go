package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// Two ModelPools whose dispatcher selectors overlap, one real dispatcher
// that both select: the dispatcher keeps the first pool's policy and
// refuses the second's with 409 pool_mismatch, the second pool's status
// says so (Synced=False and Degraded=True, DispatcherHeldByOtherPool,
// naming the pod and the other pool), and neither pool's policy version
// climbs: they do not bump versions over each other.
func TestOverlappingPoolsShowAPushError(t *testing.T) {
	e, backends := sampleEnv(t, 1)
	first := e.ns + "/llm"
	if took, err := allHold(e.disp, 5*time.Second, func(p *policy.Policy) error {
		if p.Pool != first || len(p.Backends) != len(backends) {
			return fmt.Errorf("pool %s with %d backends: %w", p.Pool, len(p.Backends), errMismatch)
		}
		return nil
	}); err != nil {
		t.Fatalf("the dispatcher does not hold %s's policy after %s: %v", first, took, err)
	}
	testutil.Eventually(t, 5*time.Second, "llm synced", func() error {
		return conditionIs(e.pool().Status.Conditions, v1alpha1.ModelPoolSynced, metav1.ConditionTrue, string(v1alpha1.ReasonAllSynced))
	})

	// A second pool, and a tier for it, selecting the same dispatcher pods.
	ctx := context.Background()
	second := &v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "llm-b"}, Spec: *e.pool().Spec.DeepCopy()}
	if err := k8s.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	tier := &v1alpha1.ServiceTier{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "b-premium"},
		Spec: v1alpha1.ServiceTierSpec{PoolRef: v1alpha1.LocalObjectReference{Name: "llm-b"}, TolerableWait: metav1.Duration{Duration: 5 * time.Second}}}
	tier.Spec.TenantShare = resource.MustParse("1")
	if err := k8s.Create(ctx, tier); err != nil {
		t.Fatal(err)
	}

	wantMsg := fmt.Sprintf("dispatcher %s holds the policy of ModelPool %s and refuse(s) this pool's: the two pools' spec.dispatchers.selector overlap. Make them disjoint; a dispatcher changes pool only when it restarts",
		e.disp[0].pod, first)
	var secondVersion int64
	testutil.Eventually(t, 10*time.Second, "llm-b reports the overlap", func() error {
		var p v1alpha1.ModelPool
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "llm-b"}, &p); err != nil {
			return err
		}
		for _, typ := range []string{v1alpha1.ModelPoolSynced, v1alpha1.ModelPoolDegraded} {
			status := metav1.ConditionFalse
			if typ == v1alpha1.ModelPoolDegraded {
				status = metav1.ConditionTrue
			}
			if err := conditionIs(p.Status.Conditions, typ, status, string(v1alpha1.ReasonDispatcherHeldByOtherPool)); err != nil {
				return err
			}
			if c := condition(p.Status.Conditions, typ); c.Message != wantMsg {
				return fmt.Errorf("%s message %q, want %q", typ, c.Message, wantMsg)
			}
		}
		secondVersion = p.Status.PolicyVersion
		return nil
	})
	firstVersion := e.pool().Status.PolicyVersion
	held, err := getPolicy(e.disp[0])
	if err != nil {
		t.Fatal(err)
	}

	// Pushes go on (with backoff, and the resyncs); nothing moves.
	pushes := e.disp[0].pushes()
	time.Sleep(3 * time.Second)
	var p v1alpha1.ModelPool
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "llm-b"}, &p); err != nil {
		t.Fatal(err)
	}
	now, err := getPolicy(e.disp[0])
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("dispatcher holds %s v%d; llm v%d, llm-b v%d", now.Pool, now.Version, e.pool().Status.PolicyVersion, p.Status.PolicyVersion)
	want := fmt.Sprintf("dispatcher holds %s v%d; llm v%d, llm-b v%d", first, held.Version, firstVersion, secondVersion)
	if got != want {
		t.Errorf("after 3s: %s, want %s", got, want)
	}
	if err := conditionIs(e.pool().Status.Conditions, v1alpha1.ModelPoolSynced, metav1.ConditionTrue, string(v1alpha1.ReasonAllSynced)); err != nil {
		t.Errorf("the first pool: %v", err)
	}
	out := e.disp[0].Output()
	if n := strings.Count(out, `"msg"="refused a policy for another pool"`); n == 0 {
		t.Error("the dispatcher logged no refused push")
	}
	t.Logf("the dispatcher applied %d pushes (first pool's resyncs) and refused %d of llm-b in the run",
		e.disp[0].pushes()-pushes, strings.Count(out, `"msg"="refused a policy for another pool"`))
}
