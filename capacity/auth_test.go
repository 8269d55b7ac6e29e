package capacity

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

func TestPolicyAuthentication(t *testing.T) {
	key := policy.JWK{Kty: "OKP", Crv: "Ed25519", Kid: "k1", X: "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
	jwt := &v1alpha1.JWTAuthentication{Issuer: "https://issuer.test", Audiences: []string{"a", "b"}, TenantClaim: "tenant",
		JWKS: v1alpha1.JWKSSource{URL: "https://idp.test/jwks"}}
	tests := map[string]struct {
		spec v1alpha1.Authentication
		jwks *policy.JWKS
		want policy.Authentication
	}{
		"header without sources": {
			spec: v1alpha1.Authentication{Mode: v1alpha1.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
			want: policy.Authentication{Mode: "TrustedHeader", HeaderName: "X-Tenant-ID"}},
		"header with sources": {
			spec: v1alpha1.Authentication{Mode: v1alpha1.AuthTrustedHeader, HeaderName: "X-Team", TrustedSources: []v1alpha1.CIDR{"10.0.0.0/8", "fd00::/8"}},
			want: policy.Authentication{Mode: "TrustedHeader", HeaderName: "X-Team", TrustedSources: []string{"10.0.0.0/8", "fd00::/8"}}},
		"API keys drop the header": {
			spec: v1alpha1.Authentication{Mode: v1alpha1.AuthAPIKey, HeaderName: "X-Tenant-ID"},
			want: policy.Authentication{Mode: "APIKey"}},
		"JWT with its keys": {
			spec: v1alpha1.Authentication{Mode: v1alpha1.AuthJWT, HeaderName: "X-Tenant-ID", JWT: jwt},
			jwks: &policy.JWKS{Keys: []policy.JWK{key}},
			want: policy.Authentication{Mode: "JWT", JWT: &policy.JWT{Issuer: "https://issuer.test", Audiences: []string{"a", "b"}, TenantClaim: "tenant",
				JWKS: policy.JWKS{Keys: []policy.JWK{key}}}}},
		"JWT before any key was read": {
			spec: v1alpha1.Authentication{Mode: v1alpha1.AuthJWT, JWT: jwt},
			want: policy.Authentication{Mode: "JWT", JWT: &policy.JWT{Issuer: "https://issuer.test", Audiences: []string{"a", "b"}, TenantClaim: "tenant",
				JWKS: policy.JWKS{Keys: []policy.JWK{}}}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, policyAuthentication(tc.spec, tc.jwks)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestJWTDefaults(t *testing.T) {
	spec := v1alpha1.ModelPoolSpec{Authentication: v1alpha1.Authentication{Mode: v1alpha1.AuthJWT, JWT: &v1alpha1.JWTAuthentication{
		JWKS: v1alpha1.JWKSSource{SecretRef: &v1alpha1.JWKSKeyRef{Name: "jwks"}}}}}
	ApplyDefaults(&spec)
	want := &v1alpha1.JWTAuthentication{TenantClaim: "sub", JWKS: v1alpha1.JWKSSource{SecretRef: &v1alpha1.JWKSKeyRef{Name: "jwks", Key: "jwks.json"}}}
	if diff := cmp.Diff(want, spec.Authentication.JWT); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
