package controllers

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// TestCacheHoldsOnlyLabelledSecrets runs a cache with CacheByObject
// against a real API server: it holds the labelled Secret, never the
// others, and follows the label as it is added and removed, while the API
// server itself has every Secret.
func TestCacheHoldsOnlyLabelledSecrets(t *testing.T) {
	cfg, scheme := startAPIServer(t)
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "secrets"
	if err := direct.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, labels map[string]string) {
		t.Helper()
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Data: map[string][]byte{"k": []byte(name)}}
		if err := direct.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	mk("api-keys", map[string]string{v1alpha1.APIKeysLabel: "true"})
	mk("db-creds", nil)
	mk("labelled-false", map[string]string{v1alpha1.APIKeysLabel: "false"})

	c, err := cache.New(cfg, cache.Options{Scheme: scheme, ByObject: CacheByObject()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}

	cached := func() []string {
		var list corev1.SecretList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range list.Items {
			names = append(names, s.Name)
		}
		sort.Strings(names)
		return names
	}
	get := func(name string) error {
		return c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.Secret{})
	}
	if diff := cmp.Diff([]string{"api-keys"}, cached()); diff != "" {
		t.Errorf("cached Secrets (-want +got):\n%s", diff)
	}
	if err := get("api-keys"); err != nil {
		t.Errorf("Get of the labelled Secret: %v", err)
	}
	for _, name := range []string{"db-creds", "labelled-false"} {
		if err := get(name); !apierrors.IsNotFound(err) {
			t.Errorf("Get of %s through the cache = %v, want NotFound", name, err)
		}
		if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.Secret{}); err != nil {
			t.Errorf("the API server lacks %s: %v", name, err)
		}
	}

	// Labelling a Secret brings it in; removing the label takes it out.
	relabel := func(name string, value *string) {
		t.Helper()
		var s corev1.Secret
		if err := direct.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
			t.Fatal(err)
		}
		if value == nil {
			delete(s.Labels, v1alpha1.APIKeysLabel)
		} else {
			s.Labels = map[string]string{v1alpha1.APIKeysLabel: *value}
		}
		if err := direct.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
	}
	yes := "true"
	relabel("db-creds", &yes)
	testutil.Eventually(t, 10*time.Second, "db-creds cached once labelled", func() error { return get("db-creds") })
	relabel("api-keys", nil)
	testutil.Eventually(t, 10*time.Second, "api-keys gone from the cache once unlabelled", func() error {
		if err := get("api-keys"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Get = %v, want NotFound", err)
		}
		return nil
	})
	if diff := cmp.Diff([]string{"db-creds"}, cached()); diff != "" {
		t.Errorf("cached Secrets after relabelling (-want +got):\n%s", diff)
	}
}
