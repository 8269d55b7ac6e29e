// Package admin is the dispatcher's admin port (DESIGN.md sections 6 and 7):
//
//	PUT /v1/policy   apply a Policy (bearer token); 200 + policy.Ack,
//	                 400 invalid or of a newer schema (old policy stays),
//	                 409 older version, 413 too large, 401 no or wrong token
//	GET /v1/policy   the applied Policy (bearer token); 404 before the first
//	GET /v1/stats    queue, balancer and data-path statistics (bearer token)
//	GET /healthz     200 while the process runs
//	GET /readyz      200 only with a policy and not draining, else 503
//	GET /metrics     Prometheus
//
// Every error answer is a policy.AdminErrorBody, the type the push client
// reads: {"error":{"type":"…","message":"…"}}, plus "errors" (a list of
// {field, message}) for an invalid policy and "current_version" for a
// stale one. Every answer, refusals and 404s included, carries
// policy.SchemaHeader with the policy schema revision this dispatcher
// reads, and the ack its schemaVersion: that is how the controller learns
// what to send it (the skew rule of api/policy/v1).
//
// The bearer token is checked in constant time by a Tokens: a fixed token,
// or a tokenfile.Follower that follows a rotated token file and accepts
// the replaced token for a grace of at most 60 s.
//
// Concurrency: the handler is stateless; its Tokens and the Dispatcher it
// drives must be safe for concurrent use.
package admin
