package jwttest

import (
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Key is a private key made by openssl, with its public JWK.
type Key struct {
	// Alg is the JWS algorithm the key signs with: RS256, PS256, ES256 or
	// EdDSA.
	Alg string
	// Kid is the key ID, written into the JWK and into tokens' headers.
	Kid string
	// JWK is the public key, assembled from openssl's DER output.
	JWK policy.JWK
	// PublicPEM is `openssl pkey -pubout` (PEM): the "secret" of the
	// HS256 confusion attack.
	PublicPEM []byte

	private []byte // PEM, written to a file of the signing test's
}

// genArgs are the openssl genpkey arguments of each algorithm.
var genArgs = map[string][]string{
	policy.AlgRS256: {"-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"},
	policy.AlgPS256: {"-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"},
	policy.AlgES256: {"-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"},
	policy.AlgEdDSA: {"-algorithm", "ed25519"},
}

// NewKey makes a key for alg (RS256, PS256, ES256 or EdDSA); the Key
// outlives t. The JWK carries alg only for PS256, whose algorithm an RSA key
// does not imply.
func NewKey(t testing.TB, alg, kid string) *Key {
	t.Helper()
	args, ok := genArgs[alg]
	if !ok {
		t.Fatalf("jwttest: no key type for %q", alg)
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "key.pem")
	k := &Key{Alg: alg, Kid: kid}
	run(t, append(append([]string{"genpkey"}, args...), "-out", key)...)
	k.private = read(t, key)
	k.PublicPEM = run(t, "pkey", "-in", key, "-pubout")
	k.JWK = jwkFromDER(t, run(t, "pkey", "-in", key, "-pubout", "-outform", "DER"))
	k.JWK.Kid = kid
	if alg == policy.AlgPS256 {
		k.JWK.Alg = alg
	}
	return k
}

// files writes the private key and the signing input to a directory of
// t's and returns their paths.
func (k *Key) files(t testing.TB, input string) (key, in string) {
	t.Helper()
	dir := t.TempDir()
	key, in = filepath.Join(dir, "key.pem"), filepath.Join(dir, "input")
	write(t, key, k.private)
	write(t, in, []byte(input))
	return key, in
}

// JWKS is a key set of the keys' public JWKs.
func JWKS(keys ...*Key) policy.JWKS {
	s := policy.JWKS{Keys: []policy.JWK{}}
	for _, k := range keys {
		s.Keys = append(s.Keys, k.JWK)
	}
	return s
}

// Header is the usual header of a token signed by k: alg, kid and typ.
func (k *Key) Header() map[string]any {
	return map[string]any{"alg": k.Alg, "kid": k.Kid, "typ": "JWT"}
}

// Sign signs header.claims with k through openssl and returns the compact
// JWS. header and claims are encoded as JSON (map keys sorted).
func (k *Key) Sign(t testing.TB, header, claims map[string]any) string {
	t.Helper()
	input := signingInput(t, header, claims)
	key, in := k.files(t, input)
	var sig []byte
	switch k.Alg {
	case policy.AlgRS256:
		sig = run(t, "dgst", "-sha256", "-sign", key, in)
	case policy.AlgPS256:
		sig = run(t, "dgst", "-sha256", "-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:32", "-sign", key, in)
	case policy.AlgES256:
		sig = rawECDSA(t, run(t, "dgst", "-sha256", "-sign", key, in), 32)
	case policy.AlgEdDSA:
		sig = run(t, "pkeyutl", "-sign", "-inkey", key, "-rawin", "-in", in)
	}
	return input + "." + b64(sig)
}

// Token is Sign with k's Header.
func (k *Key) Token(t testing.TB, claims map[string]any) string {
	t.Helper()
	return k.Sign(t, k.Header(), claims)
}

// HS256WithPublicKey is the algorithm-confusion attack: an HS256 token
// whose HMAC secret is k's public key PEM, with k's kid, made by openssl.
func (k *Key) HS256WithPublicKey(t testing.TB, claims map[string]any) string {
	t.Helper()
	input := signingInput(t, map[string]any{"alg": "HS256", "kid": k.Kid, "typ": "JWT"}, claims)
	_, in := k.files(t, input)
	mac := run(t, "dgst", "-sha256", "-mac", "HMAC", "-macopt", "hexkey:"+hex.EncodeToString(k.PublicPEM), "-binary", in)
	return input + "." + b64(mac)
}

// Unsigned is an `alg: none` token: header.claims with an empty signature.
func Unsigned(t testing.TB, kid string, claims map[string]any) string {
	t.Helper()
	return signingInput(t, map[string]any{"alg": "none", "kid": kid, "typ": "JWT"}, claims) + "."
}

func signingInput(t testing.TB, header, claims map[string]any) string {
	t.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return b64(h) + "." + b64(c)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// spki is a DER SubjectPublicKeyInfo.
type spki struct {
	Algorithm pkix.AlgorithmIdentifier
	PublicKey asn1.BitString
}

var (
	oidRSA     = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	oidEC      = asn1.ObjectIdentifier{1, 2, 840, 10045, 2, 1}
	oidEd25519 = asn1.ObjectIdentifier{1, 3, 101, 112}
)

// jwkFromDER assembles the JWK of a DER public key: RSA's (n, e) from its
// PKCS #1 body, a P-256 point from its uncompressed 04||x||y, an Ed25519
// key as it is.
func jwkFromDER(t testing.TB, der []byte) policy.JWK {
	t.Helper()
	var pub spki
	if _, err := asn1.Unmarshal(der, &pub); err != nil {
		t.Fatalf("jwttest: openssl's public key DER: %v", err)
	}
	bits := pub.PublicKey.Bytes
	switch alg := pub.Algorithm.Algorithm; {
	case alg.Equal(oidRSA):
		var rsa struct{ N, E *big.Int }
		if _, err := asn1.Unmarshal(bits, &rsa); err != nil {
			t.Fatalf("jwttest: RSA public key: %v", err)
		}
		return policy.JWK{Kty: "RSA", N: b64(rsa.N.Bytes()), E: b64(rsa.E.Bytes())}
	case alg.Equal(oidEC):
		if len(bits) != 65 || bits[0] != 4 {
			t.Fatalf("jwttest: want an uncompressed P-256 point, got %d bytes", len(bits))
		}
		return policy.JWK{Kty: "EC", Crv: "P-256", X: b64(bits[1:33]), Y: b64(bits[33:])}
	case alg.Equal(oidEd25519):
		return policy.JWK{Kty: "OKP", Crv: "Ed25519", X: b64(bits)}
	default:
		t.Fatalf("jwttest: unexpected key algorithm %v", alg)
		return policy.JWK{}
	}
}

// rawECDSA turns a DER ECDSA-Sig-Value into JWS's fixed-size r||s.
func rawECDSA(t testing.TB, der []byte, size int) []byte {
	t.Helper()
	var sig struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(der, &sig); err != nil {
		t.Fatalf("jwttest: openssl's ECDSA signature: %v", err)
	}
	out := make([]byte, 2*size)
	sig.R.FillBytes(out[:size])
	sig.S.FillBytes(out[size:])
	return out
}

// run runs openssl with args and returns its standard output.
func run(t testing.TB, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func read(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
