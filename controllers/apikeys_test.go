package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// labelledOnly makes a fake client answer as the manager's cache does with
// CacheByObject: a Secret without the API-keys label is not there.
func labelledOnly() interceptor.Funcs {
	return interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if s, ok := obj.(*corev1.Secret); ok && s.Labels[v1alpha1.APIKeysLabel] != "true" {
				return apierrors.NewNotFound(corev1.Resource("secrets"), key.Name)
			}
			return nil
		},
	}
}

// metadataOnly is an API reader that fails the test when asked for more
// than an object's metadata, and counts the reads.
func metadataOnly(t *testing.T, c client.Client, reads *int, fail error) client.Reader {
	return interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			*reads++
			if _, ok := obj.(*metav1.PartialObjectMetadata); !ok {
				t.Errorf("the API reader was asked for a whole %T %s", obj, key)
			}
			if fail != nil {
				return fail
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestAPIKeySecrets reconciles the seed's pool with acme's keys in a
// Secret in each state: only a labelled Secret's keys are pushed, and the
// quota's condition says what is wrong with any other.
func TestAPIKeySecrets(t *testing.T) {
	secret := func(labels map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: "acme-keys", Labels: labels},
			Data: map[string][]byte{"k1": []byte("sk-one\n"), "k2": []byte("sk-two")}}
	}
	labelled := map[string]string{v1alpha1.APIKeysLabel: "true"}
	notLabelled := `Secret "acme-keys" lacks the label tiergate.dev/api-keys: "true", so the controller does not read it and tenant "acme" is in the policy with no API keys; ` +
		"label it with: kubectl label secret acme-keys -n " + seed.Namespace + " tiergate.dev/api-keys=true"
	tests := map[string]struct {
		secret      *corev1.Secret // nil: none
		keys        []string
		readerFails error
		wantErr     string
		wantReason  string
		wantMsg     string
		wantHashes  []string
		wantReads   int
	}{
		"labelled: its keys are pushed": {secret: secret(labelled), wantReason: "Active",
			wantHashes: []string{sha("sk-one"), sha("sk-two")}},
		"labelled, one named key": {secret: secret(labelled), keys: []string{"k2"}, wantReason: "Active",
			wantHashes: []string{sha("sk-two")}},
		"labelled, a named key missing": {secret: secret(labelled), keys: []string{"k2", "k9"}, wantReason: "SecretKeyMissing",
			wantMsg: `Secret "acme-keys" has no non-empty key k9; the other 1 keys are in force`, wantHashes: []string{sha("sk-two")}},
		"no label: nothing is pushed": {secret: secret(nil), wantReason: "SecretNotLabelled", wantMsg: notLabelled, wantReads: 1},
		"the label set to false": {secret: secret(map[string]string{v1alpha1.APIKeysLabel: "false"}), wantReason: "SecretNotLabelled",
			wantMsg: notLabelled, wantReads: 1},
		"another label only": {secret: secret(map[string]string{"app": "db"}), wantReason: "SecretNotLabelled", wantMsg: notLabelled, wantReads: 1},
		"no Secret":          {wantReason: "SecretNotFound", wantMsg: `Secret "acme-keys" does not exist; tenant "acme" is in the policy with no API keys`, wantReads: 1},
		"the API reader fails: the reconcile is retried": {secret: secret(nil), readerFails: errors.New("connection refused"),
			wantErr: "connection refused", wantReads: 1},
	}
	// The reconciles export the seed pool's gauges to the global registry.
	t.Cleanup(func() { forgetPoolMetrics(seedKey.String()) })
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			objs := seedWorld()
			for i, o := range objs {
				if q, ok := o.(*v1alpha1.TenantQuota); ok && q.Name == "acme" {
					q = q.DeepCopy()
					q.Spec.APIKeySecretRef = &v1alpha1.SecretKeysReference{Name: "acme-keys", Keys: tc.keys}
					objs[i] = q
				}
			}
			if tc.secret != nil {
				objs = append(objs, tc.secret)
			}
			store := newFakeClient(t, objs, interceptor.Funcs{})
			reads := 0
			p := &fakePusher{}
			r := &PoolReconciler{Client: interceptor.NewClient(store.(client.WithWatch), labelledOnly()),
				APIReader: metadataOnly(t, store, &reads, tc.readerFails), Pusher: p, Recorder: events.NewFakeRecorder(20),
				Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), ResyncPeriod: time.Minute, UnreachableStrike: 3}
			_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
			if got := errString(err); got != tc.wantErr {
				t.Fatalf("Reconcile error %q, want %q", got, tc.wantErr)
			}
			if reads != tc.wantReads {
				t.Errorf("%d reads around the cache, want %d", reads, tc.wantReads)
			}
			if tc.wantErr != "" {
				return
			}
			var q v1alpha1.TenantQuota
			if err := store.Get(ctx, types.NamespacedName{Namespace: seed.Namespace, Name: "acme"}, &q); err != nil {
				t.Fatal(err)
			}
			c := meta.FindStatusCondition(q.Status.Conditions, v1alpha1.ConditionReady)
			if c == nil || c.Reason != tc.wantReason || (tc.wantMsg != "" && c.Message != tc.wantMsg) {
				t.Errorf("Ready = %+v, want %s %q", c, tc.wantReason, tc.wantMsg)
			}
			if q.Status.APIKeys != int32(len(tc.wantHashes)) {
				t.Errorf("status.apiKeys = %d, want %d", q.Status.APIKeys, len(tc.wantHashes))
			}
			if len(p.pushed) == 0 {
				t.Fatal("nothing pushed")
			}
			for _, tg := range p.pushed {
				if diff := cmp.Diff(tc.wantHashes, acmeHashes(tg), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s: acme's pushed hashes (-want +got):\n%s", tg.Name, diff)
				}
			}
		})
	}
}

func acmeHashes(tg Target) []string {
	for _, tn := range tg.Policy.Tenants {
		if tn.ID == "acme" {
			return tn.APIKeySHA256
		}
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A Secret the API server shows with the label but the cache has not
// received yet is retried, not reported missing.
func TestAPIKeySecretNotCachedYet(t *testing.T) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: "k", Labels: map[string]string{v1alpha1.APIKeysLabel: "true"}}}
	store := newFakeClient(t, []client.Object{s}, interceptor.Funcs{})
	reads := 0
	notFound := interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
		return apierrors.NewNotFound(corev1.Resource("secrets"), "k")
	}}
	r := &PoolReconciler{Client: interceptor.NewClient(store.(client.WithWatch), notFound), APIReader: metadataOnly(t, store, &reads, nil)}
	_, st, err := r.readAPIKeySecret(context.Background(), seed.Namespace, &v1alpha1.SecretKeysReference{Name: "k"})
	if !errors.Is(err, errSecretNotCached) || err.Error() != fmt.Sprintf("secret %s/k: the Secret is labelled but not in the cache yet", seed.Namespace) {
		t.Errorf("error %v, want errSecretNotCached", err)
	}
	if st.missing || st.unlabelled || reads != 1 {
		t.Errorf("state %+v after %d reads", st, reads)
	}
}
