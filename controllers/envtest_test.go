package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

// testScheme serves the built-in types and tiergate's.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// startAPIServer starts kube-apiserver and etcd with the CRDs installed;
// t's cleanup stops them.
func startAPIServer(t *testing.T) (*rest.Config, *runtime.Scheme) {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := controlplane.Assets(root)
	if err != nil {
		t.Fatal(err)
	}
	scheme := testScheme(t)
	env, cfg, err := controlplane.Start(root, assets, scheme)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return cfg, scheme
}

// TestPatchStatusAgainstTheAPIServer writes ModelPool statuses through
// patchStatus to a real API server: a first status whose nested counts are
// zero is accepted whole, a stale object cannot overwrite a newer status
// under the optimistic lock but can with last-write-wins, a field left
// empty is cleared, and an unchanged status is not written.
func TestPatchStatusAgainstTheAPIServer(t *testing.T) {
	cfg, scheme := startAPIServer(t)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "patch"}}))
	pool := seed.Pool(func(p *v1alpha1.ModelPool) {
		p.Namespace = "patch"
		p.Spec.Dispatchers.Selector = metav1.LabelSelector{MatchLabels: dispLabels}
	})
	must(c.Create(ctx, pool))
	key := client.ObjectKeyFromObject(pool)
	read := func() *v1alpha1.ModelPool {
		t.Helper()
		var p v1alpha1.ModelPool
		must(c.Get(ctx, key, &p))
		return &p
	}
	write := func(p *v1alpha1.ModelPool, st v1alpha1.ModelPoolStatus, lock statusLock) (bool, error) {
		return patchStatus(ctx, c, p, &p.Status, st, lock)
	}
	stored := func(step string, want v1alpha1.ModelPoolStatus) {
		t.Helper()
		if diff := cmp.Diff(want, read().Status); diff != "" {
			t.Errorf("%s: stored status (-want +got):\n%s", step, diff)
		}
	}

	stale := read()
	first := v1alpha1.ModelPoolStatus{PolicyVersion: 1, Dispatchers: v1alpha1.DispatcherCounts{Total: 2},
		ObservedServiceTime: &metav1.Duration{Duration: 5 * time.Second}}
	if wrote, err := write(read(), first, optimisticLock); !wrote || err != nil {
		t.Fatalf("first write: wrote %v, %v", wrote, err)
	}
	stored("first write", first)

	if _, err := write(stale.DeepCopy(), v1alpha1.ModelPoolStatus{PolicyVersion: 9}, optimisticLock); !apierrors.IsConflict(err) {
		t.Errorf("stale write under the optimistic lock: %v, want a Conflict", err)
	}
	stored("after the refused stale write", first)

	cleared := first
	cleared.PolicyVersion, cleared.ObservedServiceTime = 2, nil
	if wrote, err := write(read(), cleared, optimisticLock); !wrote || err != nil {
		t.Fatalf("clearing write: wrote %v, %v", wrote, err)
	}
	stored("observedServiceTime cleared", cleared)

	cur := read()
	if wrote, err := write(cur, cleared, optimisticLock); wrote || err != nil {
		t.Errorf("unchanged status: wrote %v, %v; want no write", wrote, err)
	}
	if rv := read().ResourceVersion; rv != cur.ResourceVersion {
		t.Errorf("unchanged status moved the resourceVersion %s→%s", cur.ResourceVersion, rv)
	}

	last := v1alpha1.ModelPoolStatus{PolicyVersion: 3, Dispatchers: v1alpha1.DispatcherCounts{Total: 1, Ready: 1, Synced: 1}}
	if wrote, err := write(stale.DeepCopy(), last, lastWriteWins); !wrote || err != nil {
		t.Fatalf("stale write, last write wins: wrote %v, %v", wrote, err)
	}
	stored("last write wins", last)
}
