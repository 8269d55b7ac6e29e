package v1

import (
	"crypto/ecdh"
	"encoding/base64"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
)

// RSA modulus sizes a JWK may have: below the minimum a signature is
// forgeable in practice, above the maximum one verification is a denial of
// service.
const (
	minRSABits = 2048
	maxRSABits = 8192
)

func (c *checker) authentication(a Authentication) {
	switch a.Mode {
	case AuthAPIKey, AuthJWT:
	case AuthTrustedHeader:
		if a.HeaderName == "" {
			c.add("authentication.headerName", "is required when mode is %s", AuthTrustedHeader)
		}
	default:
		c.add("authentication.mode", "must be %q, %q or %q, got %q", AuthTrustedHeader, AuthAPIKey, AuthJWT, a.Mode)
	}
	c.trustedSources(a)
	switch {
	case a.Mode == AuthJWT && a.JWT == nil:
		c.add("authentication.jwt", "is required when mode is %s", AuthJWT)
	case a.Mode != AuthJWT && a.JWT != nil:
		c.add("authentication.jwt", "is allowed only when mode is %s", AuthJWT)
	case a.JWT != nil:
		c.jwt("authentication.jwt", a.JWT)
	}
}

// trustedSources checks the CIDRs; they apply only to the tenant header.
func (c *checker) trustedSources(a Authentication) {
	if len(a.TrustedSources) > 0 && a.Mode != AuthTrustedHeader {
		c.add("authentication.trustedSources", "applies only when mode is %s", AuthTrustedHeader)
		return
	}
	seen := map[netip.Prefix]int{}
	for i, s := range a.TrustedSources {
		f := fmt.Sprintf("authentication.trustedSources[%d]", i)
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			c.add(f, "must be a CIDR such as 10.0.0.0/8 or fd00::/8 (a single address is 10.0.0.1/32), got %q", s)
		case p != p.Masked():
			c.add(f, "%q has bits set beyond its /%d prefix; write %s", s, p.Bits(), p.Masked())
		default:
			if j, dup := seen[p]; dup {
				c.add(f, "duplicate CIDR %s (also authentication.trustedSources[%d])", s, j)
			}
			seen[p] = i
		}
	}
}

// ParseTrustedSources parses CIDRs that Validate accepted.
func ParseTrustedSources(cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func (c *checker) jwt(f string, j *JWT) {
	if j.Issuer == "" {
		c.add(f+".issuer", "is required")
	}
	if len(j.Audiences) == 0 {
		c.add(f+".audiences", "at least one audience is required")
	}
	seen := map[string]int{}
	for i, a := range j.Audiences {
		af := fmt.Sprintf("%s.audiences[%d]", f, i)
		if a == "" {
			c.add(af, "is empty")
		} else if k, dup := seen[a]; dup {
			c.add(af, "duplicate audience %q (also %s.audiences[%d])", a, f, k)
		} else {
			seen[a] = i
		}
	}
	if j.TenantClaim == "" {
		c.add(f+".tenantClaim", "is required")
	}
	c.errs = append(c.errs, CheckJWKS(f+".jwks", j.JWKS)...)
}

// CheckJWKS returns every reason the key set cannot be pushed, with field
// paths under field: private key material, a key type other than RSA, EC
// and OKP, a malformed or weak key, an algorithm the key cannot sign with,
// an encryption key, or a repeated key ID. An empty set is valid: every
// token is then refused.
func CheckJWKS(field string, s JWKS) ValidationErrors {
	var c checker
	kids := map[string]int{}
	for i, k := range s.Keys {
		f := fmt.Sprintf("%s.keys[%d]", field, i)
		c.jwk(f, k)
		if k.Kid == "" {
			continue
		}
		if len(k.Kid) > MaxKeyIDLen {
			c.add(f+".kid", "is %d bytes long; at most %d", len(k.Kid), MaxKeyIDLen)
		}
		if j, dup := kids[k.Kid]; dup {
			c.add(f+".kid", "duplicate key ID %q (also %s.keys[%d])", k.Kid, field, j)
		} else {
			kids[k.Kid] = i
		}
	}
	return c.errs
}

func (c *checker) jwk(f string, k JWK) {
	if len(k.PrivateMembers) > 0 {
		c.add(f, "holds private key material (%s); a JWKS for tiergate must hold only public keys", quoteAll(k.PrivateMembers))
		return
	}
	for _, m := range k.UnknownMembers {
		c.add(f, "has unknown member %q", m)
	}
	if k.Use != "" && k.Use != "sig" {
		c.add(f+".use", "must be \"sig\" when set, got %q", k.Use)
	}
	switch k.Kty {
	case "RSA":
		c.rsaKey(f, k)
	case "EC":
		c.ecKey(f, k)
	case "OKP":
		if k.Crv != "Ed25519" {
			c.add(f+".crv", "must be \"Ed25519\" for an OKP key, got %q", k.Crv)
		} else if b, msg := b64(k.X); msg != "" || len(b) != 32 {
			c.add(f+".x", "must be the 32-byte Ed25519 public key, base64url without padding%s", msg)
		}
	case "":
		c.add(f+".kty", "is required")
		return
	default:
		c.add(f+".kty", "must be \"RSA\", \"EC\" or \"OKP\" (public signing keys), got %q", k.Kty)
		return
	}
	if k.Alg != "" && !algFits(k) {
		c.add(f+".alg", "%q cannot be used with a %s key%s", k.Alg, k.Kty, fitsHint(k))
	}
}

func (c *checker) rsaKey(f string, k JWK) {
	n, msg := b64(k.N)
	if msg != "" || len(n) == 0 {
		c.add(f+".n", "must be the RSA modulus, base64url without padding%s", msg)
	} else if bits := new(big.Int).SetBytes(n).BitLen(); bits < minRSABits || bits > maxRSABits {
		c.add(f+".n", "is a %d-bit modulus; RSA keys must have %d to %d bits", bits, minRSABits, maxRSABits)
	}
	e, msg := b64(k.E)
	if msg != "" || len(e) == 0 {
		c.add(f+".e", "must be the RSA exponent, base64url without padding%s", msg)
		return
	}
	if v := new(big.Int).SetBytes(e); v.BitLen() > 31 || v.Int64() < 3 || v.Bit(0) == 0 {
		c.add(f+".e", "must be an odd exponent from 3 to 2^31-1")
	}
}

// ecCurves are the curves of EC keys, with their coordinate size.
var ecCurves = map[string]struct {
	curve ecdh.Curve
	size  int
}{"P-256": {ecdh.P256(), 32}, "P-384": {ecdh.P384(), 48}, "P-521": {ecdh.P521(), 66}}

func (c *checker) ecKey(f string, k JWK) {
	cv, ok := ecCurves[k.Crv]
	if !ok {
		c.add(f+".crv", "must be \"P-256\", \"P-384\" or \"P-521\" for an EC key, got %q", k.Crv)
		return
	}
	x, mx := b64(k.X)
	y, my := b64(k.Y)
	if mx != "" || len(x) != cv.size {
		c.add(f+".x", "must be the %d-byte x coordinate, base64url without padding%s", cv.size, mx)
	}
	if my != "" || len(y) != cv.size {
		c.add(f+".y", "must be the %d-byte y coordinate, base64url without padding%s", cv.size, my)
	}
	if len(x) != cv.size || len(y) != cv.size {
		return
	}
	point := append(append([]byte{4}, x...), y...)
	if _, err := cv.curve.NewPublicKey(point); err != nil {
		c.add(f, "(x, y) is not a point on %s", k.Crv)
	}
}

// algFits reports whether the key's alg suits its type and curve.
func algFits(k JWK) bool {
	if k.Kty == "RSA" {
		return rsaAlgs[k.Alg]
	}
	return curveAlg[k.Crv] == k.Alg
}

func fitsHint(k JWK) string {
	switch {
	case k.Kty == "RSA":
		return "; use RS256, RS384, RS512, PS256, PS384 or PS512"
	case curveAlg[k.Crv] != "":
		return fmt.Sprintf(" on %s; use %s", k.Crv, curveAlg[k.Crv])
	}
	return ""
}

// b64 decodes unpadded base64url; the message is "" or why not, starting
// with "; ".
func b64(s string) ([]byte, string) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, "; it is not base64url"
	}
	return b, ""
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("member %q", n)
	}
	return strings.Join(q, ", ")
}
