package v1_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/jwttest"
)

// minimal is a valid policy around auth.
func minimal(auth policy.Authentication) *policy.Policy {
	return &policy.Policy{
		Pool: "default/llm", Slots: 1, ServiceRate: 1, AgeingRate: 6, Authentication: auth,
		Tiers:    []policy.Tier{{Name: "free", TolerableWaitSeconds: 5, QueueBound: 1, TenantConcurrencyLimit: 1, TenantQueueLimit: 1}},
		Backends: []policy.Backend{{Address: "127.0.0.1:8000"}},
	}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// keys holds one openssl key of each kind, made once.
type keys struct{ rsa, ps, ec, ed *jwttest.Key }

func makeKeys(t *testing.T) keys {
	t.Helper()
	return keys{
		rsa: jwttest.NewKey(t, policy.AlgRS256, "rsa-1"),
		ps:  jwttest.NewKey(t, policy.AlgPS256, "ps-1"),
		ec:  jwttest.NewKey(t, policy.AlgES256, "ec-1"),
		ed:  jwttest.NewKey(t, policy.AlgEdDSA, "ed-1"),
	}
}

func jwtAuth(ks ...policy.JWK) policy.Authentication {
	return policy.Authentication{Mode: policy.AuthJWT, JWT: &policy.JWT{
		Issuer: "https://issuer.test", Audiences: []string{"tiergate"}, TenantClaim: "sub", JWKS: policy.JWKS{Keys: ks}}}
}

func TestValidateAuthentication(t *testing.T) {
	k := makeKeys(t)
	withMember := func(j policy.JWK, f func(*policy.JWK)) policy.JWK { f(&j); return j }
	small := new(big.Int).Lsh(big.NewInt(1), 1023)
	const jk = "authentication.jwt.jwks.keys[0]"
	tests := map[string]struct {
		auth policy.Authentication
		want []policy.FieldError
	}{
		"trusted sources": {auth: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID",
			TrustedSources: []string{"10.0.0.0/8", "127.0.0.1/32", "fd00::/8"}}},
		"JWT with every key type": {auth: jwtAuth(k.rsa.JWK, k.ps.JWK, k.ec.JWK, k.ed.JWK)},
		"JWT with no keys":        {auth: jwtAuth()},
		"a bare address": {auth: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID", TrustedSources: []string{"10.0.0.1"}},
			want: []policy.FieldError{{Field: "authentication.trustedSources[0]", Message: `must be a CIDR such as 10.0.0.0/8 or fd00::/8 (a single address is 10.0.0.1/32), got "10.0.0.1"`}}},
		"host bits": {auth: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID", TrustedSources: []string{"10.1.2.3/8"}},
			want: []policy.FieldError{{Field: "authentication.trustedSources[0]", Message: `"10.1.2.3/8" has bits set beyond its /8 prefix; write 10.0.0.0/8`}}},
		"duplicate CIDR": {auth: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID", TrustedSources: []string{"10.0.0.0/8", "10.0.0.0/8"}},
			want: []policy.FieldError{{Field: "authentication.trustedSources[1]", Message: "duplicate CIDR 10.0.0.0/8 (also authentication.trustedSources[0])"}}},
		"trusted sources in APIKey mode": {auth: policy.Authentication{Mode: policy.AuthAPIKey, TrustedSources: []string{"10.0.0.0/8"}},
			want: []policy.FieldError{{Field: "authentication.trustedSources", Message: "applies only when mode is TrustedHeader"}}},
		"JWT mode without jwt": {auth: policy.Authentication{Mode: policy.AuthJWT},
			want: []policy.FieldError{{Field: "authentication.jwt", Message: "is required when mode is JWT"}}},
		"jwt in TrustedHeader mode": {auth: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID", JWT: jwtAuth().JWT},
			want: []policy.FieldError{{Field: "authentication.jwt", Message: "is allowed only when mode is JWT"}}},
		"empty jwt fields": {auth: policy.Authentication{Mode: policy.AuthJWT, JWT: &policy.JWT{}},
			want: []policy.FieldError{
				{Field: "authentication.jwt.issuer", Message: "is required"},
				{Field: "authentication.jwt.audiences", Message: "at least one audience is required"},
				{Field: "authentication.jwt.tenantClaim", Message: "is required"},
			}},
		"bad audiences": {auth: policy.Authentication{Mode: policy.AuthJWT, JWT: &policy.JWT{Issuer: "i", TenantClaim: "sub", Audiences: []string{"a", "", "a"}}},
			want: []policy.FieldError{
				{Field: "authentication.jwt.audiences[1]", Message: "is empty"},
				{Field: "authentication.jwt.audiences[2]", Message: `duplicate audience "a" (also authentication.jwt.audiences[0])`},
			}},
		"private RSA key": {auth: jwtAuth(withMember(k.rsa.JWK, func(j *policy.JWK) { j.PrivateMembers = []string{"d", "dp", "dq", "p", "q", "qi"} })),
			want: []policy.FieldError{{Field: jk, Message: `holds private key material (member "d", member "dp", member "dq", member "p", member "q", member "qi"); a JWKS for tiergate must hold only public keys`}}},
		"symmetric key": {auth: jwtAuth(policy.JWK{Kty: "oct", PrivateMembers: []string{"k"}}),
			want: []policy.FieldError{{Field: jk, Message: `holds private key material (member "k"); a JWKS for tiergate must hold only public keys`}}},
		"oct without k": {auth: jwtAuth(policy.JWK{Kty: "oct"}),
			want: []policy.FieldError{{Field: jk + ".kty", Message: `must be "RSA", "EC" or "OKP" (public signing keys), got "oct"`}}},
		"no kty": {auth: jwtAuth(policy.JWK{}),
			want: []policy.FieldError{{Field: jk + ".kty", Message: "is required"}}},
		"unknown member and encryption use": {auth: jwtAuth(withMember(k.ec.JWK, func(j *policy.JWK) { j.UnknownMembers = []string{"foo"}; j.Use = "enc" })),
			want: []policy.FieldError{{Field: jk, Message: `has unknown member "foo"`}, {Field: jk + ".use", Message: `must be "sig" when set, got "enc"`}}},
		"1024-bit RSA": {auth: jwtAuth(withMember(k.rsa.JWK, func(j *policy.JWK) { j.N = b64(small.Bytes()) })),
			want: []policy.FieldError{{Field: jk + ".n", Message: "is a 1024-bit modulus; RSA keys must have 2048 to 8192 bits"}}},
		"padded modulus and even exponent": {auth: jwtAuth(withMember(k.rsa.JWK, func(j *policy.JWK) { j.N += "="; j.E = b64([]byte{1, 0}) })),
			want: []policy.FieldError{
				{Field: jk + ".n", Message: "must be the RSA modulus, base64url without padding; it is not base64url"},
				{Field: jk + ".e", Message: "must be an odd exponent from 3 to 2^31-1"},
			}},
		"RSA key with an EC algorithm": {auth: jwtAuth(withMember(k.rsa.JWK, func(j *policy.JWK) { j.Alg = "ES256" })),
			want: []policy.FieldError{{Field: jk + ".alg", Message: `"ES256" cannot be used with a RSA key; use RS256, RS384, RS512, PS256, PS384 or PS512`}}},
		"RSA key with HS256": {auth: jwtAuth(withMember(k.rsa.JWK, func(j *policy.JWK) { j.Alg = "HS256" })),
			want: []policy.FieldError{{Field: jk + ".alg", Message: `"HS256" cannot be used with a RSA key; use RS256, RS384, RS512, PS256, PS384 or PS512`}}},
		"P-256 key with ES384": {auth: jwtAuth(withMember(k.ec.JWK, func(j *policy.JWK) { j.Alg = "ES384" })),
			want: []policy.FieldError{{Field: jk + ".alg", Message: `"ES384" cannot be used with a EC key on P-256; use ES256`}}},
		"EC point off the curve": {auth: jwtAuth(withMember(k.ec.JWK, func(j *policy.JWK) { j.Y = j.X })),
			want: []policy.FieldError{{Field: jk, Message: "(x, y) is not a point on P-256"}}},
		"EC short coordinate and unknown curve": {auth: jwtAuth(withMember(k.ec.JWK, func(j *policy.JWK) { j.X = b64([]byte{1, 2}) }), withMember(k.ec.JWK, func(j *policy.JWK) { j.Crv = "secp256k1"; j.Kid = "x" })),
			want: []policy.FieldError{
				{Field: jk + ".x", Message: "must be the 32-byte x coordinate, base64url without padding"},
				{Field: "authentication.jwt.jwks.keys[1].crv", Message: `must be "P-256", "P-384" or "P-521" for an EC key, got "secp256k1"`},
			}},
		"Ed448 and a short Ed25519 key": {auth: jwtAuth(withMember(k.ed.JWK, func(j *policy.JWK) { j.Crv = "Ed448" }), withMember(k.ed.JWK, func(j *policy.JWK) { j.X = b64([]byte{1}); j.Kid = "y" })),
			want: []policy.FieldError{
				{Field: jk + ".crv", Message: `must be "Ed25519" for an OKP key, got "Ed448"`},
				{Field: "authentication.jwt.jwks.keys[1].x", Message: "must be the 32-byte Ed25519 public key, base64url without padding"},
			}},
		"duplicate and long key IDs": {auth: jwtAuth(k.rsa.JWK, withMember(k.ec.JWK, func(j *policy.JWK) { j.Kid = "rsa-1" }), withMember(k.ed.JWK, func(j *policy.JWK) { j.Kid = strings.Repeat("k", 129) })),
			want: []policy.FieldError{
				{Field: "authentication.jwt.jwks.keys[1].kid", Message: `duplicate key ID "rsa-1" (also authentication.jwt.jwks.keys[0])`},
				{Field: "authentication.jwt.jwks.keys[2].kid", Message: "is 129 bytes long; at most 128"},
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := minimal(tc.auth).Validate()
			var got []policy.FieldError
			var ve policy.ValidationErrors
			if errors.As(err, &ve) {
				got = ve
			} else if err != nil {
				t.Fatalf("error %v is not ValidationErrors", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// A private key decoded from JSON is refused by name, and its private
// members never come out again.
func TestJWKPrivateMembersNeverEncoded(t *testing.T) {
	k := jwttest.NewKey(t, policy.AlgES256, "ec-1")
	doc := map[string]any{"kty": "EC", "crv": "P-256", "kid": "ec-1", "x": k.JWK.X, "y": k.JWK.Y, "d": "c2VjcmV0", "x5c": []string{"MIIB"}}
	raw, _ := json.Marshal(map[string]any{"keys": []any{doc}})
	var s policy.JWKS
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	want := policy.JWK{Kty: "EC", Crv: "P-256", Kid: "ec-1", X: k.JWK.X, Y: k.JWK.Y, PrivateMembers: []string{"d"}}
	if diff := cmp.Diff(want, s.Keys[0]); diff != "" {
		t.Errorf("decoded (-want +got)\n%s", diff)
	}
	out, _ := json.Marshal(s)
	if strings.Contains(string(out), `"d"`) || strings.Contains(string(out), "c2VjcmV0") {
		t.Errorf("encoded %s carries the private member", out)
	}
	errs := policy.CheckJWKS("jwks", s)
	wantErrs := policy.ValidationErrors{{Field: "jwks.keys[0]", Message: `holds private key material (member "d"); a JWKS for tiergate must hold only public keys`}}
	if diff := cmp.Diff(wantErrs, errs); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestJWKDecodeErrors(t *testing.T) {
	tests := map[string]string{
		`{"jwt":{"jwks":{"keys":[{"kty":"RSA","n":5}]}}}`: `JWK member "n" must be a string`,
		`{"jwt":{"jwks":{"keys":["RSA"]}}}`:               "a JWK must be a JSON object",
	}
	for in, want := range tests {
		var a policy.Authentication
		err := json.Unmarshal([]byte(in), &a)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %q", in, err, want)
		}
	}
}

func TestAlgorithmIsBoundToTheKey(t *testing.T) {
	tests := []struct {
		key  policy.JWK
		want string
	}{
		{policy.JWK{Kty: "RSA"}, "RS256"},
		{policy.JWK{Kty: "RSA", Alg: "PS384"}, "PS384"},
		{policy.JWK{Kty: "EC", Crv: "P-256"}, "ES256"},
		{policy.JWK{Kty: "EC", Crv: "P-384"}, "ES384"},
		{policy.JWK{Kty: "EC", Crv: "P-521"}, "ES512"},
		{policy.JWK{Kty: "OKP", Crv: "Ed25519"}, "EdDSA"},
		{policy.JWK{Kty: "OKP", Crv: "X25519"}, ""},
	}
	for _, tc := range tests {
		if got := tc.key.Algorithm(); got != tc.want {
			t.Errorf("%+v: Algorithm() = %q, want %q", tc.key, got, tc.want)
		}
	}
}
