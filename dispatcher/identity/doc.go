// Package identity finds who is calling: it turns a request's credential
// into a tenant and that tenant's tier, using only the policy (a client can
// never choose its tier), and strips the credential before the request is
// forwarded.
//
// Three modes, from the policy's authentication block:
//   - TrustedHeader: an upstream gateway names the tenant in a header. With
//     trustedSources the header is believed only when the TCP peer
//     (r.RemoteAddr, never a forwarded-for header) lies in one of the CIDRs.
//     Tenants the policy does not list get the default tier, or are refused.
//   - APIKey: the SHA-256 of the Bearer key is compared, in constant time,
//     with every key hash in the policy.
//   - JWT: the Bearer token's signature is verified by go-jose with the key
//     its kid names and only that key's algorithm (jwt.go chooses the key
//     and checks exp, nbf, iss, aud and the tenant claim); the keys come
//     inside the policy. Verified tokens are cached until exp, keyed on the
//     whole token (cache.go), and key IDs that no key matches are kept for
//     the push ack.
//
// An Identifier is compiled from one policy and is immutable, so it is safe
// for concurrent use; a new policy gets a new Identifier, which Reusing lets
// share the previous one's token cache and unknown key IDs when the JWT
// block is the same. The cache and the key ID log are guarded by their own
// mutexes.
package identity
