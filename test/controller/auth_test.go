package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/jwttest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// sampleAuth is the samples' authentication block, which the tests swap.
const sampleAuth = "  authentication:\n    mode: TrustedHeader\n    headerName: X-Tenant-ID\n"

// authEnv runs one dispatcher and one model pod with a simserver behind
// it, and applies the samples with auth as their authentication block
// (YAML under spec, indented two spaces) on one ready replica.
func authEnv(t *testing.T, auth string) (*env, *dispatcher) {
	t.Helper()
	e := newEnv(t)
	d := e.startDispatchers(1)[0]
	e.serveModels("--concurrency", "4", "--service-time", "const:1ms")
	e.applySamples(func(s string) string { return replaceOnce(t, s, sampleAuth, auth) })
	e.scale(1)
	waitHolds(t, e, slots(4))
	return e, d
}

// jwtAuthYAML is a JWT authentication block whose jwks is the given YAML.
func jwtAuthYAML(jwks string) string {
	return "  authentication:\n    mode: JWT\n    jwt:\n      issuer: https://issuer.test\n      audiences: [tiergate]\n      jwks:\n        " + jwks + "\n"
}

// holdsKeys accepts a JWT policy whose key IDs are kids.
func holdsKeys(kids ...string) func(*policy.Policy) error {
	return func(p *policy.Policy) error {
		j := p.Authentication.JWT
		if p.Authentication.Mode != policy.AuthJWT || j == nil {
			return fmt.Errorf("authentication %+v, want JWT", p.Authentication)
		}
		got := []string{}
		for _, k := range j.JWKS.Keys {
			got = append(got, k.Kid)
		}
		if !slices.Equal(got, kids) {
			return fmt.Errorf("key IDs %v, want %v", got, kids)
		}
		return nil
	}
}

// waitHolds waits until every dispatcher of e holds a policy check accepts.
func waitHolds(t *testing.T, e *env, check func(*policy.Policy) error) {
	t.Helper()
	if took, err := allHold(e.disp, 10*time.Second, check); err != nil {
		t.Fatalf("after %s: %v", took, err)
	}
}

func acmeToken(t *testing.T, k *jwttest.Key) string {
	t.Helper()
	return k.Token(t, map[string]any{"iss": "https://issuer.test", "aud": "tiergate", "sub": "acme", "exp": time.Now().Add(time.Hour).Unix()})
}

// call sends one completion to d with header h from a client bound to
// from ("" leaves the source to the kernel); it returns the status and
// the refusal message.
func call(t *testing.T, d *dispatcher, from string, h http.Header) (int, string) {
	t.Helper()
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
	req, _ := http.NewRequest(http.MethodPost, d.DataURL("/v1/completions"), strings.NewReader(`{"model":"m","prompt":"hi"}`))
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	return resp.StatusCode, testutil.ParseRefusal(t, b).Error.Message
}

func bearer(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

func expectCall(t *testing.T, d *dispatcher, from string, h http.Header, code int, msg string) {
	t.Helper()
	if gotCode, gotMsg := call(t, d, from, h); gotCode != code || gotMsg != msg {
		t.Fatalf("answer %d %q, want %d %q", gotCode, gotMsg, code, msg)
	}
}

func poolCondition(t *testing.T, e *env, typ string, status metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, typ+" "+reason, func() error {
		c := condition(e.pool().Status.Conditions, typ)
		switch {
		case c == nil:
			return fmt.Errorf("no %s condition", typ)
		case c.Status != status || c.Reason != reason || c.Message != msg:
			return fmt.Errorf("%s is %s/%s %q, want %s/%s %q", typ, c.Status, c.Reason, c.Message, status, reason, msg)
		}
		return nil
	})
}

func jwksJSON(t *testing.T, keys ...*jwttest.Key) string {
	t.Helper()
	b, err := json.Marshal(jwttest.JWKS(keys...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The samples trust the tenant header from anyone: the pool says so with
// a Warning, until trustedSources names the gateway; from then on only
// the gateway's address is believed.
func TestTenantHeaderUnprotected(t *testing.T) {
	e, d := authEnv(t, sampleAuth)
	poolCondition(t, e, v1alpha1.ModelPoolTenantHeaderUnprotected, metav1.ConditionTrue, "NoTrustedSources",
		"any client that reaches the dispatchers can name any tenant in the X-Tenant-ID header; set spec.authentication.trustedSources "+
			"to the CIDRs of the gateway that sets it (for example 10.0.12.0/24), or use mode APIKey or JWT")
	testutil.Eventually(t, 5*time.Second, "Warning event TenantHeaderUnprotected", func() error {
		return hasEvent(e.ns, "llm", corev1.EventTypeWarning, "TenantHeaderUnprotected", "set spec.authentication.trustedSources")
	})
	acme := http.Header{"X-Tenant-Id": {"acme"}}
	expectCall(t, d, e.ip(101), acme, http.StatusOK, "")

	gateway := e.ip(100) + "/32"
	kubectl.Must(t, "-n", e.ns, "patch", "modelpool", "llm", "--type", "merge", "-p",
		`{"spec":{"authentication":{"trustedSources":["`+gateway+`"]}}}`)
	waitHolds(t, e, func(p *policy.Policy) error {
		if !slices.Equal(p.Authentication.TrustedSources, []string{gateway}) {
			return fmt.Errorf("trusted sources %v", p.Authentication.TrustedSources)
		}
		return nil
	})
	poolCondition(t, e, v1alpha1.ModelPoolTenantHeaderUnprotected, metav1.ConditionFalse, "TrustedSourcesSet",
		"the X-Tenant-ID header is believed only from "+gateway)
	expectCall(t, d, e.ip(100), acme, http.StatusOK, "")
	expectCall(t, d, e.ip(101), http.Header{"X-Tenant-Id": {"acme"}, "X-Forwarded-For": {e.ip(100)}}, http.StatusUnauthorized,
		"the X-Tenant-ID header is believed only from the pool's trusted sources (authentication.trustedSources), and this connection comes from "+
			e.ip(101)+"; send requests through the gateway")
}

// JWKS from a labelled Secret and a labelled ConfigMap: the keys follow
// edits of the object, and an unlabelled ConfigMap is invisible to the
// controller, which says so.
func TestJWKSFromSecretAndConfigMap(t *testing.T) {
	k1 := jwttest.NewKey(t, policy.AlgRS256, "k1")
	k2 := jwttest.NewKey(t, policy.AlgES256, "k2")
	k3 := jwttest.NewKey(t, policy.AlgEdDSA, "k3")
	ctx := context.Background()
	e, d := authEnv(t, jwtAuthYAML("secretRef: {name: jwks}"))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "jwks", Labels: map[string]string{"tiergate.dev/api-keys": "true"}},
		StringData: map[string]string{"jwks.json": jwksJSON(t, k1)}}
	if err := k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	waitHolds(t, e, holdsKeys("k1"))
	poolCondition(t, e, v1alpha1.ModelPoolJWKSReady, metav1.ConditionTrue, "JWKSLoaded", `1 signing keys from Secret "jwks" key "jwks.json" (key IDs k1)`)
	expectCall(t, d, "", bearer(acmeToken(t, k1)), http.StatusOK, "")
	expectCall(t, d, "", bearer(acmeToken(t, k2)), http.StatusUnauthorized,
		"the token's key ID is not in the pool's JWKS (1 keys); new keys are fetched when dispatchers report one")

	secret.StringData = map[string]string{"jwks.json": jwksJSON(t, k1, k2)}
	if err := k8s.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	waitHolds(t, e, holdsKeys("k1", "k2"))
	expectCall(t, d, "", bearer(acmeToken(t, k2)), http.StatusOK, "")

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "jwks-cm"}, Data: map[string]string{"keys.json": jwksJSON(t, k3)}}
	if err := k8s.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	kubectl.Must(t, "-n", e.ns, "patch", "modelpool", "llm", "--type", "json", "-p",
		`[{"op":"replace","path":"/spec/authentication/jwt/jwks","value":{"configMapRef":{"name":"jwks-cm","key":"keys.json"}}}]`)
	notVisible := `ConfigMap "jwks-cm" does not exist or lacks the label tiergate.dev/jwks: "true" (the controller sees no other ConfigMap); ` +
		"the policy carries no keys, so every token is refused"
	poolCondition(t, e, v1alpha1.ModelPoolJWKSReady, metav1.ConditionFalse, "JWKSNotFound", notVisible)
	testutil.Eventually(t, 5*time.Second, "Warning event JWKSNotFound", func() error {
		return hasEvent(e.ns, "llm", corev1.EventTypeWarning, "JWKSNotFound", `ConfigMap "jwks-cm"`)
	})
	waitHolds(t, e, holdsKeys())
	expectCall(t, d, "", bearer(acmeToken(t, k1)), http.StatusUnauthorized,
		"the token's key ID is not in the pool's JWKS (0 keys); new keys are fetched when dispatchers report one")

	kubectl.Must(t, "-n", e.ns, "label", "configmap", "jwks-cm", "tiergate.dev/jwks=true")
	waitHolds(t, e, holdsKeys("k3"))
	poolCondition(t, e, v1alpha1.ModelPoolJWKSReady, metav1.ConditionTrue, "JWKSLoaded", `1 signing keys from ConfigMap "jwks-cm" key "keys.json" (key IDs k3)`)
	expectCall(t, d, "", bearer(acmeToken(t, k3)), http.StatusOK, "")
}

// idp is an HTTPS JWKS endpoint on loopback with a certificate of the
// suite's CA, whose document a test swaps.
type idp struct {
	*httptest.Server
	mu      sync.Mutex
	doc     string
	fetches atomic.Int32
}

func startIDP(t *testing.T, doc string) *idp {
	t.Helper()
	i := &idp{doc: doc}
	i.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		i.fetches.Add(1)
		i.mu.Lock()
		defer i.mu.Unlock()
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = io.WriteString(w, i.doc)
	}))
	cfg, err := jwksCA.serverConfig("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	i.TLS = cfg
	i.StartTLS()
	t.Cleanup(i.Close)
	return i
}

func (i *idp) publish(doc string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.doc = doc
}

// A key rotation through a JWKS URL: a token signed with the new key is
// refused at first, the dispatcher reports its key ID in the push ack,
// the controller fetches the URL again (long before its 10m interval) and
// pushes the new key, and the token is then accepted.
func TestJWKSFromURLRotation(t *testing.T) {
	k1 := jwttest.NewKey(t, policy.AlgES256, "k1")
	k2 := jwttest.NewKey(t, policy.AlgRS256, "k2")
	srv := startIDP(t, jwksJSON(t, k1))
	url := srv.URL + "/jwks.json"
	e, d := authEnv(t, jwtAuthYAML("url: "+url))
	waitHolds(t, e, holdsKeys("k1"))
	poolCondition(t, e, v1alpha1.ModelPoolJWKSReady, metav1.ConditionTrue, "JWKSLoaded", "1 signing keys from "+url+" (key IDs k1)")
	expectCall(t, d, "", bearer(acmeToken(t, k1)), http.StatusOK, "")
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches before the rotation, want 1", n)
	}

	srv.publish(jwksJSON(t, k1, k2))
	newToken := acmeToken(t, k2)
	expectCall(t, d, "", bearer(newToken), http.StatusUnauthorized,
		"the token's key ID is not in the pool's JWKS (1 keys); new keys are fetched when dispatchers report one")
	start := time.Now()
	testutil.Eventually(t, 20*time.Second, "the new key accepted", func() error {
		if code, msg := call(t, d, "", bearer(newToken)); code != http.StatusOK {
			return fmt.Errorf("%d %s", code, msg)
		}
		return nil
	})
	t.Logf("the rotated key was accepted %s after the first refusal", time.Since(start).Round(time.Millisecond))
	waitHolds(t, e, holdsKeys("k1", "k2"))
	poolCondition(t, e, v1alpha1.ModelPoolJWKSReady, metav1.ConditionTrue, "JWKSLoaded", "2 signing keys from "+url+" (key IDs k1, k2)")
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2: the first and the one the unknown key ID asked for", n)
	}
	expectCall(t, d, "", bearer(acmeToken(t, k1)), http.StatusOK, "")
}
