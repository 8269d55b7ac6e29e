package v1

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
)

// JWT is how a dispatcher in JWT mode checks a Bearer token. The keys travel
// inside the policy, so a dispatcher holds no credentials and fetches
// nothing.
type JWT struct {
	// Issuer must equal the token's iss claim.
	Issuer string `json:"issuer"`
	// Audiences: the token's aud claim must name one of them.
	Audiences []string `json:"audiences"`
	// TenantClaim names the claim whose string value is the tenant.
	TenantClaim string `json:"tenantClaim"`
	// JWKS holds the public keys that may sign tokens.
	JWKS JWKS `json:"jwks"`
}

// JWKS is a JSON Web Key Set (RFC 7517) of public signing keys.
type JWKS struct {
	Keys []JWK `json:"keys"`
}

// MaxUnknownKeyIDs bounds Measured.UnknownKeyIDs, and maxKeyIDLen the length
// of one, so tokens that name made-up key IDs cannot grow an ack.
const (
	MaxUnknownKeyIDs = 16
	MaxKeyIDLen      = 128
)

// JWK is one public key. Only the public members of RSA, EC and OKP keys
// are kept; a decoded key that carried private members lists their names
// (never their values) in PrivateMembers, and Validate refuses it, so a
// mistake never ships a private key to the dispatchers.
type JWK struct {
	Kty string `json:"kty"`
	Kid string `json:"kid,omitempty"`
	Use string `json:"use,omitempty"`
	Alg string `json:"alg,omitempty"`
	Crv string `json:"crv,omitempty"`
	// N and E are an RSA key's modulus and exponent, base64url.
	N string `json:"n,omitempty"`
	E string `json:"e,omitempty"`
	// X and Y are an EC key's point, X an OKP key's public key, base64url.
	X string `json:"x,omitempty"`
	Y string `json:"y,omitempty"`

	// PrivateMembers names the private-key members the decoded key held.
	PrivateMembers []string `json:"-"`
	// UnknownMembers names members that are neither kept nor ignorable.
	UnknownMembers []string `json:"-"`
}

// privateMembers carry private or secret key material (RFC 7518 section 6).
var privateMembers = map[string]bool{"d": true, "p": true, "q": true, "dp": true, "dq": true, "qi": true, "oth": true, "k": true}

// ignoredMembers are public members a JWKS may carry that a dispatcher does
// not need; they are dropped.
var ignoredMembers = map[string]bool{"key_ops": true, "x5c": true, "x5t": true, "x5t#S256": true, "x5u": true}

// UnmarshalJSON keeps the public members and records, by name only, the
// private and unknown ones for Validate.
func (k *JWK) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return errors.New("a JWK must be a JSON object")
	}
	*k = JWK{}
	fields := map[string]*string{"kty": &k.Kty, "kid": &k.Kid, "use": &k.Use, "alg": &k.Alg, "crv": &k.Crv,
		"n": &k.N, "e": &k.E, "x": &k.X, "y": &k.Y}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch dst, ok := fields[name]; {
		case ok:
			if err := json.Unmarshal(m[name], dst); err != nil {
				return fmt.Errorf("JWK member %q must be a string", name)
			}
		case privateMembers[name]:
			k.PrivateMembers = append(k.PrivateMembers, name)
		case !ignoredMembers[name]:
			k.UnknownMembers = append(k.UnknownMembers, name)
		}
	}
	return nil
}

// Signature algorithms a JWK may be bound to.
const (
	AlgRS256 = "RS256"
	AlgRS384 = "RS384"
	AlgRS512 = "RS512"
	AlgPS256 = "PS256"
	AlgPS384 = "PS384"
	AlgPS512 = "PS512"
	AlgES256 = "ES256"
	AlgES384 = "ES384"
	AlgES512 = "ES512"
	AlgEdDSA = "EdDSA"
)

// curveAlg is the one algorithm of each EC and OKP curve.
var curveAlg = map[string]string{"P-256": AlgES256, "P-384": AlgES384, "P-521": AlgES512, "Ed25519": AlgEdDSA}

// rsaAlgs are the algorithms an RSA key can sign with.
var rsaAlgs = map[string]bool{AlgRS256: true, AlgRS384: true, AlgRS512: true, AlgPS256: true, AlgPS384: true, AlgPS512: true}

// Algorithm is the one signature algorithm the key verifies: its alg when
// set, else RS256 for RSA and the curve's algorithm for EC and OKP. A token
// signed with anything else is refused, whatever its header says.
func (k JWK) Algorithm() string {
	if k.Alg != "" {
		return k.Alg
	}
	if k.Kty == "RSA" {
		return AlgRS256
	}
	return curveAlg[k.Crv]
}
