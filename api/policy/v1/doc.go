// Package v1 (imported as policy) is the wire contract between the tiergate controller and its
// dispatchers: the Policy document (DESIGN.md section 11), its decoding from
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
// # Schema revisions and the skew rule
//
// The document names the revision of its schema in schemaVersion
// (SchemaVersion is this build's; absent is revision 0, the document
// before it had the field). Every answer of a dispatcher's admin API
// carries its revision in the SchemaHeader header, and its Ack in
// schemaVersion; a dispatcher that sends neither is at revision 0. The
// rule, like Kubernetes' version skew policy, is that a controller sends
// every dispatcher only what that dispatcher declares it understands:
//
//   - A dispatcher accepts a document of its own revision or an older
//     one, and refuses a newer one with ErrUnsupportedSchema (the admin
//     API's 400 unsupported_schema), before any unknown field, since a
//     newer document's fields are not typos; so a controller older than
//     its dispatchers needs nothing. Unknown fields stay refused at every
//     revision, so hand-written policy files keep strict decoding.
//   - The controller writes each pod's policy with At(rev), rev the
//     revision the pod declared: every field newer than rev is cleared
//     and schemaVersion is rev (omitted at 0). A pod whose revision is
//     not known yet gets this build's; if it answers 400 with an older
//     revision in its header (or none), it gets At of that one at once.
//   - The fields At clears that were in use are features the pod cannot
//     enforce: the ModelPool's DispatcherSkew condition names the older
//     pods and those features, with a Warning event.
//
// Fields newer than revision 1 are listed in a registry (the revision that
// introduced each, how to tell it is in use, how to clear it); each must
// be optional, and a test fails on a Policy field that is neither in the
// frozen list of revision 0 (testdata/schema-revision-0.txt) nor in the
// registry. Adding a field is: raise SchemaVersion, register the field.
// The Ack is read leniently by the controller, so new ack fields need no
// revision.
//
// A Policy is a plain value. Decode and Validate are pure functions with no
// shared state, so they are safe for concurrent use; a decoded *Policy must
// not be mutated once it has been handed to a dispatcher or a queue.
//
// The package imports only the standard library and sigs.k8s.io/yaml (for
// policy files); it never imports Kubernetes API or HTTP packages.
package v1
