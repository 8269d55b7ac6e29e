package integration

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// jwtAuth is a JWT authentication block with jwks as its key source.
func jwtAuth(jwks map[string]any) map[string]any {
	return map[string]any{"mode": "JWT", "jwt": map[string]any{
		"issuer": "https://issuer.test", "audiences": []any{"tiergate"}, "jwks": jwks}}
}

func setJWKS(jwks map[string]any) mutation { return set("spec.authentication", jwtAuth(jwks)) }

// The CEL rules of spec.authentication on the real API server: CIDRs are
// checked with the Kubernetes CEL library's isCIDR and cidr().masked(),
// the JWKS source is exactly one of three, and URLs must be https.
func TestAuthenticationIsValidated(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	const (
		notCIDR   = "must be a CIDR such as 10.0.0.0/8 or fd00::/8 (a single address is 10.0.0.1/32)"
		hostBits  = "must have no bits set beyond its prefix length, such as 10.0.0.0/8 rather than 10.1.2.3/8"
		oneSource = "Invalid value: jwt.jwks must set exactly one of secretRef, configMapRef and url"
		https     = "jwt.jwks.url must be an https:// URL with a host"
		jwtNeeded = "Invalid value: authentication.jwt is required when authentication.mode is JWT and allowed only then"
	)
	url := map[string]any{"url": "https://idp.test/jwks.json"}
	tests := map[string]struct {
		mutate mutation
		want   []cause
	}{
		"a bare address": {set("spec.authentication.trustedSources", []any{"10.0.0.0/8", "10.0.0.1"}),
			[]cause{invalid("spec.authentication.trustedSources[1]", `Invalid value: "10.0.0.1": `+notCIDR)}},
		"not an address": {set("spec.authentication.trustedSources", []any{"gateway"}),
			[]cause{invalid("spec.authentication.trustedSources[0]", `Invalid value: "gateway": `+notCIDR)}},
		"host bits set": {set("spec.authentication.trustedSources", []any{"10.1.2.3/8"}),
			[]cause{invalid("spec.authentication.trustedSources[0]", `Invalid value: "10.1.2.3/8": `+hostBits)}},
		"IPv6 host bits set": {set("spec.authentication.trustedSources", []any{"fd00::1/8"}),
			[]cause{invalid("spec.authentication.trustedSources[0]", `Invalid value: "fd00::1/8": `+hostBits)}},
		"prefix too long": {set("spec.authentication.trustedSources", []any{"10.0.0.0/33"}),
			[]cause{invalid("spec.authentication.trustedSources[0]", `Invalid value: "10.0.0.0/33": `+notCIDR)}},
		"duplicate CIDR": {set("spec.authentication.trustedSources", []any{"10.0.0.0/8", "10.0.0.0/8"}),
			[]cause{{metav1.CauseTypeFieldValueDuplicate, "spec.authentication.trustedSources[1]", `Duplicate value: "10.0.0.0/8"`}}},
		"trusted sources in APIKey mode": {set("spec.authentication", map[string]any{"mode": "APIKey", "trustedSources": []any{"10.0.0.0/8"}}),
			[]cause{invalid("spec.authentication.trustedSources", "Invalid value: authentication.trustedSources applies only when authentication.mode is TrustedHeader")}},
		"JWT mode without jwt": {set("spec.authentication", map[string]any{"mode": "JWT"}),
			[]cause{invalid("spec.authentication", jwtNeeded)}},
		"jwt in TrustedHeader mode": {set("spec.authentication.jwt", jwtAuth(url)["jwt"]),
			[]cause{invalid("spec.authentication", jwtNeeded)}},
		"two key sources": {setJWKS(map[string]any{"url": "https://idp.test/jwks.json", "secretRef": map[string]any{"name": "jwks"}}),
			[]cause{invalid("spec.authentication.jwt.jwks", oneSource)}},
		"no key source": {setJWKS(map[string]any{}),
			[]cause{invalid("spec.authentication.jwt.jwks", oneSource)}},
		"plain http URL": {setJWKS(map[string]any{"url": "http://idp.test/jwks.json"}),
			[]cause{invalid("spec.authentication.jwt.jwks.url", `Invalid value: "http://idp.test/jwks.json": `+https)}},
		"not a URL": {setJWKS(map[string]any{"url": "idp.test/jwks.json"}),
			[]cause{invalid("spec.authentication.jwt.jwks.url", `Invalid value: "idp.test/jwks.json": `+https)}},
		"URL without a host": {setJWKS(map[string]any{"url": "https:///jwks.json"}),
			[]cause{invalid("spec.authentication.jwt.jwks.url", `Invalid value: "https:///jwks.json": `+https)}},
		"refresh interval of a Secret": {setJWKS(map[string]any{"secretRef": map[string]any{"name": "jwks"}, "refreshInterval": "5m"}),
			[]cause{invalid("spec.authentication.jwt.jwks.refreshInterval", "Invalid value: jwt.jwks.refreshInterval applies only to a url")}},
		"refresh interval below 1m": {setJWKS(map[string]any{"url": "https://idp.test/jwks.json", "refreshInterval": "30s"}),
			[]cause{invalid("spec.authentication.jwt.jwks.refreshInterval", `Invalid value: "30s": jwt.jwks.refreshInterval must be a duration of at least 1m, such as 10m`)}},
		"no audiences": {set("spec.authentication", map[string]any{"mode": "JWT", "jwt": map[string]any{"issuer": "i", "audiences": []any{}, "jwks": url}}),
			[]cause{invalid("spec.authentication.jwt.audiences", "Invalid value: 0: spec.authentication.jwt.audiences in body should have at least 1 items")}},
		"empty issuer": {set("spec.authentication", map[string]any{"mode": "JWT", "jwt": map[string]any{"issuer": "", "audiences": []any{"a"}, "jwks": url}}),
			[]cause{invalid("spec.authentication.jwt.issuer", `Invalid value: "": spec.authentication.jwt.issuer in body should be at least 1 chars long`)}},
		"Secret key with a slash": {setJWKS(map[string]any{"secretRef": map[string]any{"name": "jwks", "key": "a/b"}}),
			[]cause{invalid("spec.authentication.jwt.jwks.secretRef.key", `Invalid value: "a/b": spec.authentication.jwt.jwks.secretRef.key in body should match '^[-._a-zA-Z0-9]+$'`)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, "ModelPool", "llm", tc.mutate)
			got := refusal(t, k8sClient.Create(context.Background(), obj))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("causes (-want +got):\n%s", diff)
			}
		})
	}
}

// The accepting side of the same rules, with the defaults filled in.
func TestAuthenticationIsAccepted(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	tests := map[string]struct {
		mutate mutation
		field  string
		want   any
	}{
		"IPv4 and IPv6 CIDRs": {set("spec.authentication.trustedSources", []any{"10.0.0.0/8", "127.0.0.1/32", "fd00::/8", "::1/128"}),
			"spec.authentication.trustedSources", []any{"10.0.0.0/8", "127.0.0.1/32", "fd00::/8", "::1/128"}},
		"JWT from a URL, tenant claim defaults to sub": {setJWKS(map[string]any{"url": "https://idp.test:8443/.well-known/jwks.json", "refreshInterval": "1m"}),
			"spec.authentication.jwt.tenantClaim", "sub"},
		"JWT from a Secret, key defaults": {setJWKS(map[string]any{"secretRef": map[string]any{"name": "jwks"}}),
			"spec.authentication.jwt.jwks.secretRef.key", "jwks.json"},
		"JWT from a ConfigMap key": {setJWKS(map[string]any{"configMapRef": map[string]any{"name": "jwks", "key": "keys.json"}}),
			"spec.authentication.jwt.jwks.configMapRef.key", "keys.json"},
		"JWT keeps the default header name": {setJWKS(map[string]any{"url": "https://127.0.0.1/jwks"}),
			"spec.authentication.headerName", "X-Tenant-ID"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obj := fromSample(t, ns, "ModelPool", "llm", tc.mutate)
			checkStored(t, obj, tc.field, tc.want)
		})
	}
}
