package identity_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/internal/jwttest"
)

// now is the fake clock's time in every JWT test.
var now = time.Unix(1_800_000_000, 0)

const issuer = "https://issuer.test"

// testKeys are openssl keys made once per test binary.
type testKeys struct {
	rsa, ps, ec, ed, other *jwttest.Key
}

var (
	keysOnce sync.Once
	keySet   testKeys
)

func openSSLKeys(t testing.TB) testKeys {
	keysOnce.Do(func() {
		keySet = testKeys{
			rsa:   jwttest.NewKey(t, policy.AlgRS256, "rsa-1"),
			ps:    jwttest.NewKey(t, policy.AlgPS256, "ps-1"),
			ec:    jwttest.NewKey(t, policy.AlgES256, "ec-1"),
			ed:    jwttest.NewKey(t, policy.AlgEdDSA, "ed-1"),
			other: jwttest.NewKey(t, policy.AlgRS256, "rsa-1"), // another key under rsa-1's kid
		}
	})
	return keySet
}

func jwtPolicy(keys ...*jwttest.Key) *policy.Policy {
	return &policy.Policy{
		Authentication: policy.Authentication{Mode: policy.AuthJWT, JWT: &policy.JWT{
			Issuer: issuer, Audiences: []string{"tiergate", "llm"}, TenantClaim: "sub", JWKS: jwttest.JWKS(keys...)}},
		Tiers:   []policy.Tier{{Name: "premium"}, {Name: "free"}},
		Tenants: []policy.Tenant{{ID: "acme", Tier: "premium"}, {ID: "bob", Tier: "free"}},
	}
}

// claims are valid claims for tenant acme at now, with changes.
func claims(change func(map[string]any)) map[string]any {
	c := map[string]any{"iss": issuer, "aud": "tiergate", "sub": "acme", "exp": now.Add(time.Hour).Unix(), "nbf": now.Add(-time.Minute).Unix()}
	if change != nil {
		change(c)
	}
	return c
}

// refusal is a refused request as a client sees it.
type refusal struct {
	Status  int
	Type    string
	Message string
}

func refusalOf(err error) refusal {
	rec := httptest.NewRecorder()
	apierror.FromIdentity(err).Write(rec)
	var b struct {
		Error struct{ Type, Message string }
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &b)
	return refusal{rec.Code, b.Error.Type, b.Error.Message}
}

func bearerRequest(token string) *http.Request {
	return &http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}, RemoteAddr: "192.0.2.7:40000"}
}

func unauth(msg string) *refusal { return &refusal{http.StatusUnauthorized, "unauthenticated", msg} }

func TestJWTRefusals(t *testing.T) {
	k := openSSLKeys(t)
	seg := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	valid := k.rsa.Token(t, claims(nil))
	parts := strings.Split(valid, ".")
	tests := map[string]struct {
		token string
		want  *refusal // nil: accepted as acme, premium
	}{
		"RS256":                     {token: valid},
		"PS256":                     {token: k.ps.Token(t, claims(nil))},
		"ES256":                     {token: k.ec.Token(t, claims(nil))},
		"EdDSA":                     {token: k.ed.Token(t, claims(nil))},
		"EdDSA without a key ID":    {token: k.ed.Sign(t, map[string]any{"alg": "EdDSA"}, claims(nil))},
		"audience list":             {token: k.ec.Token(t, claims(func(c map[string]any) { c["aud"] = []string{"other", "llm"} }))},
		"expired within the leeway": {token: k.ec.Token(t, claims(func(c map[string]any) { c["exp"] = now.Add(-30 * time.Second).Unix() }))},
		"nbf within the leeway":     {token: k.ec.Token(t, claims(func(c map[string]any) { c["nbf"] = now.Add(30 * time.Second).Unix() }))},
		"expired": {token: k.rsa.Token(t, claims(func(c map[string]any) { c["exp"] = now.Add(-61 * time.Second).Unix() })),
			want: unauth("the token expired at 2027-01-15T07:58:59Z (leeway 1m0s)")},
		"not yet valid": {token: k.ec.Token(t, claims(func(c map[string]any) { c["nbf"] = now.Add(61 * time.Second).Unix() })),
			want: unauth("the token is not valid before 2027-01-15T08:01:01Z (leeway 1m0s)")},
		"no exp": {token: k.ed.Token(t, claims(func(c map[string]any) { delete(c, "exp") })),
			want: unauth("the token has no exp claim; tokens must expire")},
		"wrong issuer": {token: k.rsa.Token(t, claims(func(c map[string]any) { c["iss"] = "https://evil.test" })),
			want: unauth(`the token's iss claim is not the pool's issuer "https://issuer.test"`)},
		"wrong audience": {token: k.rsa.Token(t, claims(func(c map[string]any) { c["aud"] = []string{"other"} })),
			want: unauth(`the token's aud claim names none of the pool's audiences ("tiergate", "llm")`)},
		"no audience": {token: k.rsa.Token(t, claims(func(c map[string]any) { delete(c, "aud") })),
			want: unauth(`the token's aud claim names none of the pool's audiences ("tiergate", "llm")`)},
		"another key under the same key ID": {token: k.other.Token(t, claims(nil)),
			want: unauth("the token's signature does not verify with the pool's key")},
		"a payload swapped under a valid signature": {token: parts[0] + "." + seg(claims(func(c map[string]any) { c["sub"] = "bob" })) + "." + parts[2],
			want: unauth("the token's signature does not verify with the pool's key")},
		"unknown key ID": {token: k.rsa.Sign(t, map[string]any{"alg": "RS256", "kid": "rsa-2"}, claims(nil)),
			want: unauth("the token's key ID is not in the pool's JWKS (4 keys); new keys are fetched when dispatchers report one")},
		"alg none": {token: jwttest.Unsigned(t, "rsa-1", claims(nil)),
			want: unauth("the token is not signed (alg none); tokens must be signed with a key of the pool's JWKS")},
		"alg NONE": {token: seg(map[string]any{"alg": "NONE"}) + "." + seg(claims(nil)) + ".",
			want: unauth("the token is not signed (alg none); tokens must be signed with a key of the pool's JWKS")},
		"HS256 with the RSA public key as its secret": {token: k.rsa.HS256WithPublicKey(t, claims(nil)),
			want: unauth("the token's algorithm HS256 does not match its key, which verifies only RS256")},
		"HS256 without a key ID": {token: seg(map[string]any{"alg": "HS256"}) + "." + parts[1] + "." + parts[2],
			want: unauth("the token names no key ID and no key of the pool's JWKS verifies HS256")},
		"RS256 under an EC key's ID": {token: k.rsa.Sign(t, map[string]any{"alg": "RS256", "kid": "ec-1"}, claims(nil)),
			want: unauth("the token's algorithm RS256 does not match its key, which verifies only ES256")},
		"a made-up algorithm": {token: seg(map[string]any{"alg": "XX<script>", "kid": "rsa-1"}) + "." + parts[1] + "." + parts[2],
			want: unauth("the token's algorithm an unknown algorithm does not match its key, which verifies only RS256")},
		"no alg": {token: seg(map[string]any{"kid": "rsa-1"}) + "." + parts[1] + "." + parts[2],
			want: unauth("the token's header names no algorithm")},
		"missing tenant claim": {token: k.ec.Token(t, claims(func(c map[string]any) { delete(c, "sub") })),
			want: unauth(`the token has no "sub" claim to name the tenant`)},
		"non-string tenant claim": {token: k.ec.Token(t, claims(func(c map[string]any) { c["sub"] = 42 })),
			want: unauth(`the token's "sub" claim is a number, not a string`)},
		"object tenant claim": {token: k.ec.Token(t, claims(func(c map[string]any) { c["sub"] = map[string]any{"id": "acme"} })),
			want: unauth(`the token's "sub" claim is an object, not a string`)},
		"empty tenant claim": {token: k.ec.Token(t, claims(func(c map[string]any) { c["sub"] = "" })),
			want: unauth(`the token's "sub" claim is empty`)},
		"tenant claim with a space": {token: k.ec.Token(t, claims(func(c map[string]any) { c["sub"] = "ac me" })),
			want: unauth(`the token's "sub" claim may hold only visible ASCII characters`)},
		"exp of the wrong type": {token: k.ec.Token(t, claims(func(c map[string]any) { c["exp"] = "tomorrow" })),
			want: unauth("the token's claims are not a JSON object with well-typed exp, nbf, iss and aud")},
		"unknown tenant": {token: k.ec.Token(t, claims(func(c map[string]any) { c["sub"] = "carol" })),
			want: &refusal{http.StatusForbidden, "unknown_tenant", `tenant "carol" is not known and the pool has no default tier`}},
		"not a JWT":           {token: "sk-live-123", want: unauth("the Bearer token is not a JWT: want three base64url parts separated by dots")},
		"header not JSON":     {token: "bm90IGpzb24." + parts[1] + "." + parts[2], want: unauth("the token's header is not base64url-encoded JSON")},
		"signature not b64":   {token: parts[0] + "." + parts[1] + ".!!!", want: unauth("the token is not a well-formed signed JWT")},
		"longer than 16 KiB":  {token: strings.Repeat("a", 16<<10+1), want: unauth("the Bearer token is longer than 16384 bytes")},
		"five parts (a JWE)":  {token: "a.b.c.d.e", want: unauth("the Bearer token is not a JWT: want three base64url parts separated by dots")},
		"empty bearer":        {token: " ", want: unauth("the Bearer JWT is empty")},
		"trailing whitespace": {token: valid + " "},
	}
	clk := clocktesting.NewFakePassiveClock(now)
	id := identity.New(jwtPolicy(k.rsa, k.ps, k.ec, k.ed), identity.WithClock(clk))
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := id.Identify(bearerRequest(tc.token))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if diff := cmp.Diff(identity.Identity{Tenant: "acme", Tier: "premium"}, got); diff != "" {
					t.Errorf("(-want +got)\n%s", diff)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %+v", got)
			}
			r := refusalOf(err)
			if diff := cmp.Diff(*tc.want, r); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if len(tc.token) > 8 && strings.Contains(r.Message, tc.token[len(tc.token)-8:]) {
				t.Errorf("the message %q repeats the token", r.Message)
			}
		})
	}
	if diff := cmp.Diff([]string{"rsa-2"}, id.UnknownKeyIDs()); diff != "" {
		t.Errorf("unknown key IDs (-want +got)\n%s", diff)
	}
}

// The header refusals of JWT mode, before any token is read.
func TestJWTHeaderRefusals(t *testing.T) {
	id := identity.New(jwtPolicy(openSSLKeys(t).ec))
	tests := map[string]struct {
		header http.Header
		want   refusal
	}{
		"no Authorization": {http.Header{}, *unauth(`missing token; send "Authorization: Bearer <JWT>"`)},
		"Basic":            {http.Header{"Authorization": {"Basic YWNtZTp4"}}, *unauth(`the Authorization header must be "Bearer <JWT>"`)},
		"repeated": {http.Header{"Authorization": {"Bearer a.b.c", "Bearer a.b.c"}},
			refusal{http.StatusBadRequest, "bad_request", "the Authorization header is repeated 2 times; send it once"}},
		"the tenant header is ignored": {http.Header{"X-Tenant-Id": {"acme"}}, *unauth(`missing token; send "Authorization: Bearer <JWT>"`)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := id.Identify(&http.Request{Header: tc.header, RemoteAddr: "127.0.0.1:1"})
			if diff := cmp.Diff(tc.want, refusalOf(err)); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// A verified token is served from the cache until its exp; a token whose
// signature differs is verified afresh; a new JWKS drops the cache.
func TestJWTCache(t *testing.T) {
	k := openSSLKeys(t)
	clk := clocktesting.NewFakePassiveClock(now)
	pol := jwtPolicy(k.rsa, k.ec)
	id := identity.New(pol, identity.WithClock(clk))
	token := k.ec.Token(t, claims(func(c map[string]any) { c["exp"] = now.Add(time.Minute).Unix() }))
	mustIdentify(t, id, token)

	// The same token with its signature changed in one byte must not hit.
	parts := strings.Split(token, ".")
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[len(sig)-1] ^= 1
	forged := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig)
	if _, err := id.Identify(bearerRequest(forged)); refusalOf(err) != *unauth("the token's signature does not verify with the pool's key") {
		t.Errorf("forged signature: %v", err)
	}

	// A policy with the same JWT block keeps the cache; one whose JWKS
	// lost the key checks the token afresh and refuses it.
	same := identity.New(jwtPolicy(k.rsa, k.ec), identity.WithClock(clk), identity.Reusing(id))
	mustIdentify(t, same, token)
	rotated := identity.New(jwtPolicy(k.rsa), identity.WithClock(clk), identity.Reusing(id))
	if _, err := rotated.Identify(bearerRequest(token)); refusalOf(err) != *unauth("the token's key ID is not in the pool's JWKS (1 keys); new keys are fetched when dispatchers report one") {
		t.Errorf("after the key left the JWKS: %v", err)
	}

	// Past exp the cache does not answer; within the leeway the token is
	// verified again and accepted, beyond it refused.
	clk.SetTime(now.Add(time.Minute + 30*time.Second))
	mustIdentify(t, id, token)
	clk.SetTime(now.Add(2*time.Minute + time.Second))
	if _, err := id.Identify(bearerRequest(token)); refusalOf(err) != *unauth("the token expired at 2027-01-15T08:01:00Z (leeway 1m0s)") {
		t.Errorf("past exp and leeway: %v", err)
	}
}

func mustIdentify(t *testing.T, id *identity.Identifier, token string) {
	t.Helper()
	got, err := id.Identify(bearerRequest(token))
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	if got != (identity.Identity{Tenant: "acme", Tier: "premium"}) {
		t.Fatalf("identified as %+v", got)
	}
}

func TestJWTStrip(t *testing.T) {
	id := identity.New(jwtPolicy(openSSLKeys(t).ec))
	h := http.Header{"Authorization": {"Bearer x.y.z"}, "X-Tiergate-Tenant": {"spoof"}, "X-Tier": {"premium"}}
	id.Strip(h, "acme")
	if diff := cmp.Diff(http.Header{"X-Tiergate-Tenant": {"acme"}}, h); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
