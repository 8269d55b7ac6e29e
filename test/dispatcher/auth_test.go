package dispatcher

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/jwttest"
)

// fromPeer is a client whose TCP connections come from the loopback
// address ip, bound with a net.Dialer LocalAddr.
func fromPeer(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

func send(t *testing.T, c *http.Client, url string, header http.Header) result {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// The tenant header is believed only from a peer inside trustedSources:
// the dispatcher reads the TCP peer, so a client on 127.0.0.2 is refused
// whatever it claims in X-Forwarded-For.
func TestTrustedSources(t *testing.T) {
	s := startSim(t, "--concurrency", "4", "--service-time", "const:1ms")
	p := basePolicy(1, 4, s.Addr)
	p.Authentication.TrustedSources = []string{"127.0.0.1/32"}
	d := startDispatcher(t, dispOpts{policy: p})
	url := d.DataURL("/v1/completions")
	outside := "the X-Tenant-ID header is believed only from the pool's trusted sources (authentication.trustedSources), " +
		"and this connection comes from 127.0.0.2; send requests through the gateway"

	if got := send(t, fromPeer("127.0.0.1"), url, http.Header{"X-Tenant-Id": {"acme"}}); got.err != nil || got.code != http.StatusOK {
		t.Fatalf("from the trusted peer: %d %s %v", got.code, got.body, got.err)
	}
	tests := map[string]http.Header{
		"a premium tenant":             {"X-Tenant-Id": {"acme"}},
		"a forwarded-for that lies":    {"X-Tenant-Id": {"acme"}, "X-Forwarded-For": {"127.0.0.1"}, "X-Real-Ip": {"127.0.0.1"}, "Forwarded": {"for=127.0.0.1"}},
		"no tenant header at all":      {},
		"the default tier's tenant id": {"X-Tenant-Id": {"nobody"}},
	}
	for name, h := range tests {
		t.Run(name, func(t *testing.T) {
			checkRefusal(t, send(t, fromPeer("127.0.0.2"), url, h), wantRefusal{code: 401, typ: "unauthenticated", msg: outside})
		})
	}
	var arrivals []string
	for _, a := range s.Stats(t).Arrivals {
		arrivals = append(arrivals, a.Tenant)
	}
	if diff := cmp.Diff([]string{"acme"}, arrivals); diff != "" {
		t.Errorf("tenants the model server saw (-want +got)\n%s", diff)
	}
	if n := d.Metrics(t)[`tiergate_rejections_total{cause="unauthenticated",pool="default/llm",tier=""}`]; n != 4 {
		t.Errorf("unauthenticated rejections %v, want 4", n)
	}

	// Without trusted sources the same peer is believed, as before.
	p.Version, p.Authentication.TrustedSources = 2, nil
	d.MustPutPolicy(t, p)
	if got := send(t, fromPeer("127.0.0.2"), url, http.Header{"X-Tenant-Id": {"acme"}}); got.err != nil || got.code != http.StatusOK {
		t.Fatalf("without trusted sources: %d %s %v", got.code, got.body, got.err)
	}
}

// jwtDispatcherPolicy is basePolicy in JWT mode with keys.
func jwtDispatcherPolicy(version int64, backend string, keys ...*jwttest.Key) *policy.Policy {
	p := basePolicy(version, 4, backend)
	p.Authentication = policy.Authentication{Mode: policy.AuthJWT, JWT: &policy.JWT{
		Issuer: "https://issuer.test", Audiences: []string{"tiergate"}, TenantClaim: "tenant", JWKS: jwttest.JWKS(keys...)}}
	p.DefaultTier = ""
	return p
}

func jwtClaims(tenant string, change func(map[string]any)) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": "https://issuer.test", "aud": "tiergate", "tenant": tenant, "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
	if change != nil {
		change(c)
	}
	return c
}

func bearer(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

// JWT tenants through the real dispatcher, with tokens openssl signed:
// each refusal as a client sees it, the tenant the model server sees, and
// the unknown key ID the next push's ack reports.
func TestJWTTenants(t *testing.T) {
	s := startSim(t, "--concurrency", "4", "--service-time", "const:1ms")
	rsa := jwttest.NewKey(t, policy.AlgRS256, "rsa-1")
	ec := jwttest.NewKey(t, policy.AlgES256, "ec-1")
	ed := jwttest.NewKey(t, policy.AlgEdDSA, "ed-1")
	p := jwtDispatcherPolicy(1, s.Addr, rsa, ec, ed)
	d := startDispatcher(t, dispOpts{policy: p})
	url := d.DataURL("/v1/completions")
	c := http.DefaultClient

	for _, k := range []*jwttest.Key{rsa, ec, ed} {
		tenant := map[string]string{"rsa-1": "acme", "ec-1": "globex", "ed-1": "initech"}[k.Kid]
		if got := send(t, c, url, bearer(k.Token(t, jwtClaims(tenant, nil)))); got.code != http.StatusOK {
			t.Fatalf("%s token: %d %s", k.Alg, got.code, got.body)
		}
	}
	unauth := func(msg string) wantRefusal { return wantRefusal{code: 401, typ: "unauthenticated", msg: msg} }
	expiredAt := time.Now().Add(-2 * time.Minute).Unix()
	tests := map[string]struct {
		token string
		want  wantRefusal
	}{
		"expired": {rsa.Token(t, jwtClaims("acme", func(c map[string]any) { c["exp"] = expiredAt })),
			unauth("the token expired at " + time.Unix(expiredAt, 0).UTC().Format(time.RFC3339) + " (leeway 1m0s)")},
		"wrong audience": {ec.Token(t, jwtClaims("acme", func(c map[string]any) { c["aud"] = "other" })),
			unauth(`the token's aud claim names none of the pool's audiences ("tiergate")`)},
		"alg none": {jwttest.Unsigned(t, "rsa-1", jwtClaims("acme", nil)),
			unauth("the token is not signed (alg none); tokens must be signed with a key of the pool's JWKS")},
		"HS256 with the public key as secret": {rsa.HS256WithPublicKey(t, jwtClaims("acme", nil)),
			unauth("the token's algorithm HS256 does not match its key, which verifies only RS256")},
		"non-string tenant": {ed.Token(t, jwtClaims("acme", func(c map[string]any) { c["tenant"] = true })),
			unauth(`the token's "tenant" claim is a boolean, not a string`)},
		"unknown tenant": {ed.Token(t, jwtClaims("hooli", nil)),
			wantRefusal{code: 403, typ: "unknown_tenant", msg: `tenant "hooli" is not known and the pool has no default tier`}},
		"a key the pool does not hold": {jwttest.NewKey(t, policy.AlgES256, "ec-2").Token(t, jwtClaims("acme", nil)),
			unauth("the token's key ID is not in the pool's JWKS (3 keys); new keys are fetched when dispatchers report one")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := send(t, c, url, bearer(tc.token))
			checkRefusal(t, got, tc.want)
			if strings.Contains(got.body, tc.token[len(tc.token)-12:]) {
				t.Errorf("the refusal repeats the token: %s", got.body)
			}
		})
	}
	var arrivals []string
	for _, a := range s.Stats(t).Arrivals {
		arrivals = append(arrivals, a.Tenant)
	}
	if diff := cmp.Diff([]string{"acme", "globex", "initech"}, arrivals); diff != "" {
		t.Errorf("tenants the model server saw (-want +got)\n%s", diff)
	}

	// A resync of the same policy answers with the key ID it lacked.
	code, body := d.PutPolicy(t, p)
	var ack policy.Ack
	if err := json.Unmarshal(body, &ack); code != http.StatusOK || err != nil {
		t.Fatalf("PUT /v1/policy: %d %s", code, body)
	}
	if diff := cmp.Diff([]string{"ec-2"}, ack.Stats.UnknownKeyIDs); diff != "" {
		t.Errorf("ack unknownKeyIDs (-want +got)\n%s", diff)
	}
}

// A policy file that carries a private key is refused with the key's
// field, and the dispatcher keeps serving under its previous policy.
func TestPrivateKeyPolicyRefused(t *testing.T) {
	s := startSim(t, "--concurrency", "4", "--service-time", "const:1ms")
	ec := jwttest.NewKey(t, policy.AlgES256, "ec-1")
	d := startDispatcher(t, dispOpts{policy: jwtDispatcherPolicy(1, s.Addr, ec)})
	doc, err := json.Marshal(jwtDispatcherPolicy(2, s.Addr, ec))
	if err != nil {
		t.Fatal(err)
	}
	leaked := strings.Replace(string(doc), `"kty":"EC"`, `"kty":"EC","d":"c2VjcmV0"`, 1)
	code, body := d.AdminDo(t, http.MethodPut, "/v1/policy", d.Token, []byte(leaked))
	var got policy.AdminErrorBody
	_ = json.Unmarshal(body, &got)
	want := []policy.FieldError{{Field: "authentication.jwt.jwks.keys[0]", Message: `holds private key material (member "d"); a JWKS for tiergate must hold only public keys`}}
	if code != http.StatusBadRequest || got.Error.Type != policy.AdminInvalidPolicy {
		t.Fatalf("PUT: %d %s", code, body)
	}
	if diff := cmp.Diff(want, got.Error.Errors); diff != "" {
		t.Errorf("errors (-want +got)\n%s", diff)
	}
	if r := send(t, http.DefaultClient, d.DataURL("/v1/completions"), bearer(ec.Token(t, jwtClaims("acme", nil)))); r.code != http.StatusOK {
		t.Errorf("under the previous policy: %d %s", r.code, r.body)
	}
}
