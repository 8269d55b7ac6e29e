// Package jwttest mints JWTs for tests independently of the JOSE library
// the dispatcher verifies them with: keys come from `openssl genpkey`,
// signatures from `openssl dgst -sign` (RSA, ECDSA, whose DER signature is
// turned into the raw r||s of JWS) and `openssl pkeyutl -sign -rawin`
// (Ed25519), and the JWKS is assembled from `openssl pkey -pubout -outform
// DER`. Nothing here signs or verifies in Go.
//
// Concurrency model: a Key is immutable once made and safe for concurrent
// use; every call runs its own openssl processes in its own directory.
package jwttest
