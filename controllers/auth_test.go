package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
	"github.com/tiergate/tiergate/internal/jwttest"
)

// authRows are the authentication conditions among conds.
func authRows(conds []metav1.Condition) map[string]condRow {
	out := map[string]condRow{}
	for typ, r := range condRows(conds) {
		if typ == v1alpha1.ModelPoolTenantHeaderUnprotected || typ == v1alpha1.ModelPoolJWKSReady {
			out[typ] = r
		}
	}
	return out
}

func TestAuthConditions(t *testing.T) {
	const unprotected = "any client that reaches the dispatchers can name any tenant in the X-Tenant-ID header; set spec.authentication.trustedSources " +
		"to the CIDRs of the gateway that sets it (for example 10.0.12.0/24), or use mode APIKey or JWT"
	stale := []metav1.Condition{{Type: v1alpha1.ModelPoolTenantHeaderUnprotected, Status: metav1.ConditionTrue}, {Type: v1alpha1.ModelPoolJWKSReady, Status: metav1.ConditionTrue}}
	tests := map[string]struct {
		view authView
		want map[string]condRow
	}{
		"header without trusted sources": {authView{Mode: v1alpha1.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
			map[string]condRow{v1alpha1.ModelPoolTenantHeaderUnprotected: {v1alpha1.ModelPoolTenantHeaderUnprotected, "True", "NoTrustedSources", unprotected}}},
		"header with trusted sources": {authView{Mode: v1alpha1.AuthTrustedHeader, HeaderName: "X-Team", TrustedSources: []v1alpha1.CIDR{"10.0.0.0/8", "fd00::/8"}},
			map[string]condRow{v1alpha1.ModelPoolTenantHeaderUnprotected: {v1alpha1.ModelPoolTenantHeaderUnprotected, "False", "TrustedSourcesSet", "the X-Team header is believed only from 10.0.0.0/8, fd00::/8"}}},
		"API keys: neither condition": {authView{Mode: v1alpha1.AuthAPIKey}, map[string]condRow{}},
		"JWT with keys": {authView{Mode: v1alpha1.AuthJWT, JWKS: jwksReading{Reason: v1alpha1.ReasonJWKSLoaded, Message: "2 signing keys"}},
			map[string]condRow{v1alpha1.ModelPoolJWKSReady: {v1alpha1.ModelPoolJWKSReady, "True", "JWKSLoaded", "2 signing keys"}}},
		"JWT without keys": {authView{Mode: v1alpha1.AuthJWT, JWKS: jwksReading{Reason: v1alpha1.ReasonJWKSFetchFailed, Message: "fetching failed"}},
			map[string]condRow{v1alpha1.ModelPoolJWKSReady: {v1alpha1.ModelPoolJWKSReady, "False", "JWKSFetchFailed", "fetching failed"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			conds := append([]metav1.Condition(nil), stale...)
			setAuthConditions(&conds, metav1.Now(), 3, tc.view)
			got := authRows(conds)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			for _, c := range conds {
				if c.ObservedGeneration != 3 {
					t.Errorf("%s has observedGeneration %d", c.Type, c.ObservedGeneration)
				}
			}
		})
	}
}

func jwksDoc(t *testing.T, keys ...any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeJWKS(t *testing.T) {
	ec := jwttest.NewKey(t, policy.AlgES256, "ec-1")
	ed := jwttest.NewKey(t, policy.AlgEdDSA, "ed-1")
	withPrivate := map[string]any{"kty": "EC", "crv": "P-256", "kid": "ec-1", "x": ec.JWK.X, "y": ec.JWK.Y, "d": "c2VjcmV0"}
	encKey := map[string]any{"kty": "RSA", "use": "enc", "kid": "enc-1", "n": "AQAB", "e": "AQAB"}
	tests := map[string]struct {
		doc         []byte
		want        []policy.JWK
		wantSkipped int
		wantErr     string
	}{
		"public keys, extra members dropped": {doc: jwksDoc(t, ec.JWK, map[string]any{"kty": "OKP", "crv": "Ed25519", "kid": "ed-1", "x": ed.JWK.X, "x5t": "abc"}),
			want: []policy.JWK{ec.JWK, ed.JWK}},
		"encryption and symmetric-less keys skipped": {doc: jwksDoc(t, ec.JWK, encKey, map[string]any{"kty": "X9"}), want: []policy.JWK{ec.JWK}, wantSkipped: 2},
		"a private key refuses the document": {doc: jwksDoc(t, ec.JWK, withPrivate),
			wantErr: "invalid JWKS: keys[1] holds private key material (d); publish only the public keys"},
		"a shared secret refuses the document": {doc: jwksDoc(t, map[string]any{"kty": "oct", "k": "c2VjcmV0"}),
			wantErr: "invalid JWKS: keys[0] holds private key material (k); publish only the public keys"},
		"no signing key": {doc: jwksDoc(t, encKey), wantErr: "invalid JWKS: it holds no RSA, EC or Ed25519 signing key"},
		"a broken signing key": {doc: jwksDoc(t, map[string]any{"kty": "EC", "crv": "P-256", "x": ec.JWK.X, "y": ec.JWK.X}),
			wantErr: "invalid JWKS: keys.keys[0]: (x, y) is not a point on P-256"},
		"not JSON": {doc: []byte("<html>"), wantErr: "invalid JWKS: not a JSON Web Key Set: invalid character '<' looking for beginning of value"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, skipped, err := DecodeJWKS(tc.doc)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr || !errors.Is(err, ErrInvalidJWKS) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Keys, cmpopts.EquateEmpty()); diff != "" || skipped != tc.wantSkipped {
				t.Errorf("skipped %d, want %d; keys (-want +got)\n%s", skipped, tc.wantSkipped, diff)
			}
		})
	}
}

// jwtPool is the seed's world with the pool in JWT mode, keys from src.
func jwtPool(src v1alpha1.JWKSSource, objs ...client.Object) []client.Object {
	world := seedWorld()
	pool := world[0].(*v1alpha1.ModelPool)
	pool.Spec.Authentication = v1alpha1.Authentication{Mode: v1alpha1.AuthJWT, HeaderName: "X-Tenant-ID", JWT: &v1alpha1.JWTAuthentication{
		Issuer: "https://issuer.test", Audiences: []string{"tiergate"}, JWKS: src}}
	return append(world, objs...)
}

// A JWT pool's keys come from its Secret or ConfigMap into every pushed
// policy, and the pool's JWKSReady condition says what was read.
func TestReconcileJWKS(t *testing.T) {
	ec := jwttest.NewKey(t, policy.AlgES256, "ec-1")
	doc := jwksDoc(t, ec.JWK)
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: seed.Namespace, Name: name} }
	secretSrc := v1alpha1.JWKSSource{SecretRef: &v1alpha1.JWKSKeyRef{Name: "jwks", Key: "jwks.json"}}
	mapSrc := v1alpha1.JWKSSource{ConfigMapRef: &v1alpha1.JWKSKeyRef{Name: "jwks", Key: "keys"}}
	const noKeys = "; the policy carries no keys, so every token is refused"
	tests := map[string]struct {
		objs      []client.Object
		wantKeys  []policy.JWK
		want      condRow
		wantEvent string
	}{
		"from a Secret": {objs: jwtPool(secretSrc, &corev1.Secret{ObjectMeta: meta("jwks"), Data: map[string][]byte{"jwks.json": doc}}),
			wantKeys: []policy.JWK{ec.JWK}, want: condRow{v1alpha1.ModelPoolJWKSReady, "True", "JWKSLoaded", `1 signing keys from Secret "jwks" key "jwks.json" (key IDs ec-1)`}},
		"from a ConfigMap's binary data": {objs: jwtPool(mapSrc, &corev1.ConfigMap{ObjectMeta: meta("jwks"), BinaryData: map[string][]byte{"keys": doc}}),
			wantKeys: []policy.JWK{ec.JWK}, want: condRow{v1alpha1.ModelPoolJWKSReady, "True", "JWKSLoaded", `1 signing keys from ConfigMap "jwks" key "keys" (key IDs ec-1)`}},
		"the Secret is not there": {objs: jwtPool(secretSrc),
			want:      condRow{v1alpha1.ModelPoolJWKSReady, "False", "JWKSNotFound", `Secret "jwks" does not exist or lacks the label tiergate.dev/api-keys: "true" (the controller sees no other Secret)` + noKeys},
			wantEvent: `Warning JWKSNotFound Secret "jwks" does not exist or lacks the label tiergate.dev/api-keys: "true" (the controller sees no other Secret)` + noKeys},
		"the ConfigMap lacks the key": {objs: jwtPool(mapSrc, &corev1.ConfigMap{ObjectMeta: meta("jwks"), Data: map[string]string{"other": "{}"}}),
			want:      condRow{v1alpha1.ModelPoolJWKSReady, "False", "JWKSNotFound", `ConfigMap "jwks" has no key "keys"` + noKeys},
			wantEvent: `Warning JWKSNotFound ConfigMap "jwks" has no key "keys"` + noKeys},
		"a private key in the Secret": {objs: jwtPool(secretSrc, &corev1.Secret{ObjectMeta: meta("jwks"), Data: map[string][]byte{"jwks.json": []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AA","d":"AA"}]}`)}}),
			want:      condRow{v1alpha1.ModelPoolJWKSReady, "False", "JWKSInvalid", `Secret "jwks" key "jwks.json": invalid JWKS: keys[0] holds private key material (d); publish only the public keys` + noKeys},
			wantEvent: `Warning JWKSInvalid Secret "jwks" key "jwks.json": invalid JWKS: keys[0] holds private key material (d); publish only the public keys` + noKeys},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			t.Cleanup(func() { forgetPoolMetrics(seedKey.String()) })
			c := newFakeClient(t, tc.objs, interceptor.Funcs{})
			rec := events.NewFakeRecorder(20)
			p := &fakePusher{}
			r := &PoolReconciler{Client: c, Recorder: rec, Pusher: p, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
				ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
				t.Fatal(err)
			}
			if len(p.pushed) != 2 {
				t.Fatalf("pushed to %d dispatchers, want 2", len(p.pushed))
			}
			for _, tg := range p.pushed {
				j := tg.Policy.Authentication.JWT
				if j == nil || j.TenantClaim != "sub" || j.Issuer != "https://issuer.test" {
					t.Fatalf("%s: JWT block %+v", tg.Name, j)
				}
				if diff := cmp.Diff(tc.wantKeys, j.JWKS.Keys, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s: keys (-want +got)\n%s", tg.Name, diff)
				}
				if err := tg.Policy.Validate(); err != nil {
					t.Errorf("%s: the pushed policy is invalid: %v", tg.Name, err)
				}
			}
			var pool v1alpha1.ModelPool
			if err := c.Get(ctx, seedKey, &pool); err != nil {
				t.Fatal(err)
			}
			got := authRows(pool.Status.Conditions)
			if diff := cmp.Diff(map[string]condRow{v1alpha1.ModelPoolJWKSReady: tc.want}, got); diff != "" {
				t.Errorf("conditions (-want +got)\n%s", diff)
			}
			var evs []string
			for len(rec.Events) > 0 {
				if e := <-rec.Events; !strings.Contains(e, "AgeingHorizonExceedsClientTimeout") {
					evs = append(evs, e)
				}
			}
			var wantEvs []string
			if tc.wantEvent != "" {
				wantEvs = []string{tc.wantEvent}
			}
			if diff := cmp.Diff(wantEvs, evs); diff != "" {
				t.Errorf("events (-want +got)\n%s", diff)
			}
		})
	}
}
