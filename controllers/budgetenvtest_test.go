package controllers

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// TestQuotaLimitsStatusAgainstTheAPIServer writes the status.limits the
// controller computes to a real API server: the schema takes it (source
// enum, per-dispatcher ranges), it reads back unchanged, an unchanged
// status is not written again, and budgets removed clear it.
func TestQuotaLimitsStatusAgainstTheAPIServer(t *testing.T) {
	cfg, scheme := startAPIServer(t)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: seed.Namespace}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	quota := limitedQuota("acme", "acme", "premium", &v1alpha1.Limits{TokensPerMinute: 60001})
	if err := c.Create(ctx, &quota); err != nil {
		t.Fatal(err)
	}
	read := func() *v1alpha1.TenantQuota {
		t.Helper()
		var q v1alpha1.TenantQuota
		if err := c.Get(ctx, client.ObjectKeyFromObject(&quota), &q); err != nil {
			t.Fatal(err)
		}
		return &q
	}
	status := func(q *v1alpha1.TenantQuota, tiers []v1alpha1.ServiceTier) v1alpha1.TenantQuotaStatus {
		t.Helper()
		b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: tiers,
			Quotas: []v1alpha1.TenantQuota{*q}, Dispatchers: 3})
		if err != nil {
			t.Fatal(err)
		}
		return desiredQuotaStatus(q.Status, quotaView{Generation: q.Generation, Pool: "llm", Tenant: b.Tenants[0],
			OwnLimits: q.Spec.Limits, SharedState: v1alpha1.SharedStateLocal}, t0)
	}

	q := read()
	want := status(q, budgetSeedTiers())
	if want.Limits == nil || want.Limits.PerDispatcher == nil {
		t.Fatalf("computed status %+v has no per-dispatcher limits", want)
	}
	if wrote, err := patchStatus(ctx, c, q, &q.Status, want, lastWriteWins); !wrote || err != nil {
		t.Fatalf("write: wrote %v, %v", wrote, err)
	}
	q = read()
	if diff := cmp.Diff(want, q.Status); diff != "" {
		t.Errorf("stored status (-want +got):\n%s", diff)
	}
	rv := q.ResourceVersion
	if wrote, err := patchStatus(ctx, c, q, &q.Status, status(q, budgetSeedTiers()), lastWriteWins); wrote || err != nil {
		t.Errorf("unchanged: wrote %v, %v; want no write", wrote, err)
	}
	if got := read().ResourceVersion; got != rv {
		t.Errorf("unchanged status moved the resourceVersion %s→%s", rv, got)
	}

	q = read()
	q.Spec.Limits = nil
	if err := c.Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	q = read()
	none := status(q, seed.Tiers())
	if wrote, err := patchStatus(ctx, c, q, &q.Status, none, lastWriteWins); !wrote || err != nil {
		t.Fatalf("clearing write: wrote %v, %v", wrote, err)
	}
	if got := read().Status.Limits; got != nil {
		t.Errorf("status.limits after the budgets were removed: %+v", got)
	}
}
