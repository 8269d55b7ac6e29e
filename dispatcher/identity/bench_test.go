package identity

import (
	"net/http"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/jwttest"
)

// BenchmarkJWT is the cost of identifying one request in JWT mode: "first"
// verifies the token (the cache holds nothing), "cached" finds it in the
// cache. Tokens are made by openssl.
func BenchmarkJWT(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	claims := map[string]any{"iss": "https://issuer.test", "aud": "tiergate", "sub": "acme", "exp": now.Add(time.Hour).Unix()}
	for _, alg := range []string{policy.AlgRS256, policy.AlgES256, policy.AlgEdDSA} {
		key := jwttest.NewKey(b, alg, "k1")
		token := key.Token(b, claims)
		p := &policy.Policy{
			Authentication: policy.Authentication{Mode: policy.AuthJWT, JWT: &policy.JWT{
				Issuer: "https://issuer.test", Audiences: []string{"tiergate"}, TenantClaim: "sub", JWKS: jwttest.JWKS(key)}},
			Tiers:   []policy.Tier{{Name: "premium"}},
			Tenants: []policy.Tenant{{ID: "acme", Tier: "premium"}},
		}
		req := &http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}, RemoteAddr: "127.0.0.1:1"}
		clk := clocktesting.NewFakePassiveClock(now)
		for _, mode := range []string{"first", "cached"} {
			id := New(p, WithClock(clk))
			if mode == "first" {
				id.jwt.cache = newTokenCache(0)
			}
			b.Run(alg+"/"+mode, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := id.Identify(req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
