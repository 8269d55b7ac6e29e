package identity

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Leeway is how far exp and nbf may be off the dispatcher's clock.
const Leeway = 60 * time.Second

// maxTokenLen bounds a Bearer JWT; longer ones are refused unparsed.
const maxTokenLen = 16 << 10

// tokenCacheSize bounds the verified tokens kept per policy.
const tokenCacheSize = 4096

// verifier checks JWTs against one policy's JWT block. Signatures are
// verified by go-jose; this code chooses the key and its one algorithm and
// checks the claims.
type verifier struct {
	cfg       policy.JWT // to tell whether a new policy changes the check
	keys      []jwtKey
	byKid     map[string]int
	audiences map[string]bool
	audList   string // for messages
	clock     clock.PassiveClock
	cache     *tokenCache
	unknown   *keyIDLog
}

// jwtKey is one usable public key with the algorithm bound to it.
type jwtKey struct {
	kid string
	alg jose.SignatureAlgorithm
	key any // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// newVerifier compiles cfg. prev's cache and unknown key IDs are kept when
// cfg is the same check (keys included).
func newVerifier(cfg *policy.JWT, clk clock.PassiveClock, prev *verifier) *verifier {
	v := &verifier{cfg: *cfg, byKid: map[string]int{}, audiences: map[string]bool{}, clock: clk}
	if prev != nil && reflect.DeepEqual(prev.cfg, *cfg) {
		v.cache, v.unknown = prev.cache, prev.unknown
	} else {
		v.cache, v.unknown = newTokenCache(tokenCacheSize), &keyIDLog{}
	}
	for _, k := range cfg.JWKS.Keys {
		raw, err := json.Marshal(k)
		if err != nil {
			continue
		}
		var jk jose.JSONWebKey
		// Validate accepted the key; one the library still refuses can
		// never verify a token, which then reads as signed by no key.
		if err := jk.UnmarshalJSON(raw); err != nil || !jk.IsPublic() {
			continue
		}
		if k.Kid != "" {
			v.byKid[k.Kid] = len(v.keys)
		}
		v.keys = append(v.keys, jwtKey{kid: k.Kid, alg: jose.SignatureAlgorithm(k.Algorithm()), key: jk.Key})
	}
	quoted := make([]string, len(cfg.Audiences))
	for i, a := range cfg.Audiences {
		v.audiences[a] = true
		quoted[i] = fmt.Sprintf("%q", a)
	}
	v.audList = strings.Join(quoted, ", ")
	return v
}

func (id *Identifier) byToken(h http.Header) (string, error) {
	token, err := bearer(h, "token", "JWT")
	if err != nil {
		return "", err
	}
	return id.jwt.tenant(token)
}

// tenant is the tenant a token names, from the cache while it has not
// expired; the cache is keyed on the whole token, so a token that differs
// in any byte (its signature included) is verified afresh.
func (v *verifier) tenant(token string) (string, error) {
	now := v.clock.Now()
	if t, ok := v.cache.get(token, now); ok {
		return t, nil
	}
	tenant, exp, err := v.verify(token, now)
	if err != nil {
		return "", err
	}
	v.cache.put(token, tenant, exp, now)
	return tenant, nil
}

func failed(format string, args ...any) (string, time.Time, error) {
	return "", time.Time{}, refuse(ErrUnauthenticated, format, args...)
}

// registered are the claims checked besides the tenant's. go-jose's
// jwt.Claims is not used because it also types sub, which may be the
// tenant claim and is then reported by tenantClaim.
type registered struct {
	Issuer    string           `json:"iss"`
	Audience  jwt.Audience     `json:"aud"`
	Expiry    *jwt.NumericDate `json:"exp"`
	NotBefore *jwt.NumericDate `json:"nbf"`
}

// header is what key selection reads of a JWS header before go-jose
// parses the token.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// verify checks, in order: the token's shape, its algorithm and key, the
// signature, exp and nbf, iss, aud and the tenant claim. No message
// repeats any part of the token.
func (v *verifier) verify(token string, now time.Time) (string, time.Time, error) {
	if len(token) > maxTokenLen {
		return failed("the Bearer token is longer than %d bytes", maxTokenLen)
	}
	if strings.Count(token, ".") != 2 {
		return failed("the Bearer token is not a JWT: want three base64url parts separated by dots")
	}
	hdr, err := peekHeader(token)
	if err != nil {
		return failed("the token's header is not base64url-encoded JSON")
	}
	keys, msg := v.candidates(hdr)
	if msg != "" {
		return failed("%s", msg)
	}
	claims, all, msg := verifySignature(token, keys)
	if msg != "" {
		return failed("%s", msg)
	}
	exp, msg := v.checkTimes(claims, now)
	if msg != "" {
		return failed("%s", msg)
	}
	if claims.Issuer != v.cfg.Issuer {
		return failed("the token's iss claim is not the pool's issuer %q", v.cfg.Issuer)
	}
	if !v.audienceMatches(claims.Audience) {
		return failed("the token's aud claim names none of the pool's audiences (%s)", v.audList)
	}
	tenant, msg := tenantClaim(all, v.cfg.TenantClaim)
	if msg != "" {
		return failed("%s", msg)
	}
	return tenant, exp, nil
}

func peekHeader(token string) (header, error) {
	seg, _, _ := strings.Cut(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return header{}, err
	}
	var h header
	err = json.Unmarshal(raw, &h)
	return h, err
}

// knownAlgs may be named in messages; any other header value is not
// repeated.
var knownAlgs = map[string]bool{"none": true, "HS256": true, "HS384": true, "HS512": true,
	"RS256": true, "RS384": true, "RS512": true, "PS256": true, "PS384": true, "PS512": true,
	"ES256": true, "ES384": true, "ES512": true, "EdDSA": true}

func algName(a string) string {
	if knownAlgs[a] {
		return a
	}
	return "an unknown algorithm"
}

// candidates are the keys that may have signed a token with header h: the
// key its kid names, whose algorithm must be h's, or without a kid every
// key bound to h's algorithm.
func (v *verifier) candidates(h header) ([]jwtKey, string) {
	switch {
	case h.Alg == "":
		return nil, "the token's header names no algorithm"
	case strings.EqualFold(h.Alg, "none"):
		return nil, "the token is not signed (alg none); tokens must be signed with a key of the pool's JWKS"
	}
	if h.Kid != "" {
		i, ok := v.byKid[h.Kid]
		if !ok {
			v.unknown.record(h.Kid)
			return nil, fmt.Sprintf("the token's key ID is not in the pool's JWKS (%d keys); new keys are fetched when dispatchers report one", len(v.keys))
		}
		k := v.keys[i]
		if string(k.alg) != h.Alg {
			return nil, fmt.Sprintf("the token's algorithm %s does not match its key, which verifies only %s", algName(h.Alg), k.alg)
		}
		return []jwtKey{k}, ""
	}
	var out []jwtKey
	for _, k := range v.keys {
		if string(k.alg) == h.Alg {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Sprintf("the token names no key ID and no key of the pool's JWKS verifies %s", algName(h.Alg))
	}
	return out, ""
}

// verifySignature has go-jose check the signature with each candidate,
// allowing only the key's own algorithm, and decodes the claims of the
// first that verifies.
func verifySignature(token string, keys []jwtKey) (registered, map[string]any, string) {
	msg := "the token's signature does not verify with the pool's key"
	for _, k := range keys {
		tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{k.alg})
		if err != nil {
			return registered{}, nil, "the token is not a well-formed signed JWT"
		}
		var std registered
		var all map[string]any
		err = tok.Claims(k.key, &std, &all)
		switch {
		case err == nil:
			return std, all, ""
		case !errors.Is(err, jose.ErrCryptoFailure):
			// The signature verified; the payload is not a claims object
			// or exp, nbf or aud has the wrong type.
			msg = "the token's claims are not a JSON object with well-typed exp, nbf, iss and aud"
			return registered{}, nil, msg
		}
	}
	return registered{}, nil, msg
}

// checkTimes checks exp, which a token must have, and nbf, each with
// Leeway, and returns exp.
func (v *verifier) checkTimes(c registered, now time.Time) (time.Time, string) {
	if c.Expiry == nil {
		return time.Time{}, "the token has no exp claim; tokens must expire"
	}
	exp := c.Expiry.Time()
	if now.After(exp.Add(Leeway)) {
		return time.Time{}, fmt.Sprintf("the token expired at %s (leeway %s)", exp.UTC().Format(time.RFC3339), Leeway)
	}
	if c.NotBefore != nil {
		if nbf := c.NotBefore.Time(); now.Add(Leeway).Before(nbf) {
			return time.Time{}, fmt.Sprintf("the token is not valid before %s (leeway %s)", nbf.UTC().Format(time.RFC3339), Leeway)
		}
	}
	return exp, ""
}

func (v *verifier) audienceMatches(aud jwt.Audience) bool {
	for _, a := range aud {
		if v.audiences[a] {
			return true
		}
	}
	return false
}

// tenantClaim is the string value of the claim that names the tenant.
func tenantClaim(all map[string]any, claim string) (string, string) {
	val, ok := all[claim]
	if !ok {
		return "", fmt.Sprintf("the token has no %q claim to name the tenant", claim)
	}
	s, ok := val.(string)
	if !ok {
		return "", fmt.Sprintf("the token's %q claim is %s, not a string", claim, jsonKind(val))
	}
	if s == "" {
		return "", fmt.Sprintf("the token's %q claim is empty", claim)
	}
	if msg := badTenant(s); msg != "" {
		return "", fmt.Sprintf("the token's %q claim %s", claim, msg)
	}
	return s, ""
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "not a string"
}

// UnknownKeyIDs are the key IDs tokens named that the policy's JWKS does
// not hold, sorted; nil outside JWT mode.
func (id *Identifier) UnknownKeyIDs() []string {
	if id == nil || id.jwt == nil {
		return nil
	}
	return id.jwt.unknown.list()
}
