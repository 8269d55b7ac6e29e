// Package policy is the wire contract between the tiergate controller and its
// dispatchers: the Policy document (docs/architecture.md#the-policy-document), its decoding from
// JSON or YAML, its validation and its version ordering.
//
// Decode (JSON or YAML, unknown fields and trailing documents refused,
// errors wrap ErrDecode), Validate (every violation as ValidationErrors, a
// list of {Field, Message} with JSON field paths such as
// "tiers[1].queueBound"), DecodeAndValidate, and CheckVersion
// (ErrStaleVersion for an older version: the admin API's 409). CheckJWKS
// is the key check of JWT mode, shared with the controller: only RSA, EC
// and OKP public signing keys pass, and a key that carried private members
// (JWK records their names, never their values) is refused. The admin
// API's error body, AdminErrorBody, is defined here too, so the dispatcher
// and the controller's push client share it.
//
// A Policy is a plain value. Decode and Validate are pure functions with no
// shared state, so they are safe for concurrent use; a decoded *Policy must
// not be mutated once it has been handed to a dispatcher or a queue.
//
// The package imports only the standard library and sigs.k8s.io/yaml (for
// policy files); it never imports Kubernetes API or HTTP packages.
package policy
