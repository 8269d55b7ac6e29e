// Package identity finds who is calling: it turns a request's credential
// into a tenant and that tenant's tier, using only the policy (a client can
// never choose its tier), and strips the credential before the request is
// forwarded.
//
// Two modes, from the policy's authentication block:
//   - TrustedHeader: an upstream gateway names the tenant in a header.
//     Tenants the policy does not list get the default tier, or are refused.
//   - APIKey: the SHA-256 of the Bearer key is compared, in constant time,
//     with every key hash in the policy.
//
// An Identifier is compiled from one policy and is immutable, so it is safe
// for concurrent use; a new policy gets a new Identifier.
package identity
