package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// TestReconcileExportsTierMaxWait runs the controllers against a real
// kube-apiserver and follows tiergate_tier_max_wait_seconds in the manager's
// registry while the seed's pool changes: it must always equal the tiers'
// status.maxWait, and vanish with a tier, with the ready replicas and with
// the pool.
func TestReconcileExportsTierMaxWait(t *testing.T) {
	cfg, scheme := startAPIServer(t)

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	conf := DefaultConfig()
	conf.ResyncPeriod = time.Hour
	if err := Setup(ctx, mgr, conf); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	const ns = "metrics"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	labels := map[string]string{"app": "llm"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](6),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
			},
		},
	}
	must(c.Create(ctx, dep))
	setReady := func(n int32) {
		t.Helper()
		dep.Status.Replicas, dep.Status.ReadyReplicas = n, n
		must(c.Status().Update(ctx, dep))
	}
	setReady(6)
	// Six Ready model pods: the bounds count the Ready pods listed, at
	// most the Deployment's readyReplicas, which setReady then moves.
	for i := range 6 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("llm-%d", i), Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}}
		must(c.Create(ctx, p))
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.0.0.%d", i+1),
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		must(c.Status().Update(ctx, p))
	}
	must(c.Create(ctx, &v1alpha1.ModelPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"},
		Spec: v1alpha1.ModelPoolSpec{
			DeploymentRef:         v1alpha1.LocalObjectReference{Name: "llm"},
			ConcurrencyPerReplica: 4,
			ServiceTime:           v1alpha1.ServiceTime{Mean: metav1.Duration{Duration: 6 * time.Second}},
			ClientTimeout:         &metav1.Duration{Duration: 30 * time.Second},
			Ageing:                v1alpha1.Ageing{StarvationBound: &metav1.Duration{Duration: 120 * time.Second}},
			Backend:               v1alpha1.Backend{Port: 8000},
			Dispatchers:           v1alpha1.Dispatchers{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "dispatcher"}}},
		},
	}))
	tiers := map[string]*v1alpha1.ServiceTier{}
	for _, s := range []struct {
		name  string
		base  int32
		wait  time.Duration
		share string
	}{{"premium", 0, 5 * time.Second, "0.25"}, {"standard", 10, 20 * time.Second, "0.10"}, {"free", 20, 60 * time.Second, "0.04"}} {
		tiers[s.name] = &v1alpha1.ServiceTier{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name},
			Spec: v1alpha1.ServiceTierSpec{PoolRef: v1alpha1.LocalObjectReference{Name: "llm"}, BasePriority: s.base,
				TolerableWait: metav1.Duration{Duration: s.wait}, TenantShare: resource.MustParse(s.share)},
		}
		must(c.Create(ctx, tiers[s.name]))
	}

	// expect waits until the tiers' status.maxWait and the exported series
	// are both want (tier name → seconds; absent: no maxWait, no series).
	expect := func(step string, want map[string]float64) {
		t.Helper()
		var lines []string
		for _, name := range []string{"free", "premium", "standard"} {
			if v, ok := want[name]; ok {
				lines = append(lines, fmt.Sprintf(`tiergate_tier_max_wait_seconds{pool="metrics/llm",tier=%q} %g`, name, v))
			}
		}
		exp := ""
		if len(lines) > 0 {
			exp = maxWaitHeader + strings.Join(lines, "\n") + "\n"
		}
		var last error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			last = testutil.GatherAndCompare(ctrlmetrics.Registry, strings.NewReader(exp), "tiergate_tier_max_wait_seconds")
			if last != nil {
				continue
			}
			var list v1alpha1.ServiceTierList
			must(c.List(ctx, &list, client.InNamespace(ns)))
			for _, tr := range list.Items {
				v, ok := want[tr.Name]
				switch {
				case !ok && tr.Status.MaxWait != nil:
					last = fmt.Errorf("tier %s states maxWait %s, want none", tr.Name, tr.Status.MaxWait.Duration)
				case ok && (tr.Status.MaxWait == nil || tr.Status.MaxWait.Seconds() != v):
					last = fmt.Errorf("tier %s states maxWait %v, want %gs", tr.Name, tr.Status.MaxWait, v)
				}
			}
			if last == nil {
				return
			}
		}
		t.Fatalf("%s: %v", step, last)
	}

	// docs/architecture.md#the-bounds: ΣL = 20+80+120 drains in 55s, plus S; the
	// ageing rate is 6s per point.
	expect("the seed's pool", map[string]float64{"premium": 61, "standard": 121, "free": 181})

	premium := tiers["premium"]
	must(c.Get(ctx, client.ObjectKeyFromObject(premium), premium))
	premium.Spec.TolerableWait.Duration = 10 * time.Second // L 20→40
	must(c.Update(ctx, premium))
	expect("premium tolerates 10s", map[string]float64{"premium": 66, "standard": 126, "free": 186})

	setReady(0)
	expect("no ready replicas", nil)
	setReady(6)
	expect("replicas back", map[string]float64{"premium": 66, "standard": 126, "free": 186})

	must(c.Delete(ctx, tiers["standard"]))
	expect("standard deleted", map[string]float64{"premium": 46, "free": 166}) // ΣL = 40+120

	var pool v1alpha1.ModelPool
	must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm"}, &pool))
	must(c.Delete(ctx, &pool))
	var gone error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if gone = testutil.GatherAndCompare(ctrlmetrics.Registry, strings.NewReader(""), "tiergate_tier_max_wait_seconds"); gone == nil {
			break
		}
	}
	if gone != nil {
		t.Fatalf("pool deleted: %v", gone)
	}
}
