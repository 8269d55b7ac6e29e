// Package tokens makes tokens the unit of a request's cost
// (docs/tokens.md): it estimates what an OpenAI-compatible request will
// use before it runs, meters what the answer says it used, and keeps the
// per-tenant budgets (token buckets of requests and tokens per minute)
// that a request reserves at admission and settles when its answer ends.
//
// Job:
//   - Estimate turns a buffered body and its path into a Cost: the
//     prompt's tokens (its text's bytes ÷ the pool's bytes-per-token
//     ratio) and the output it may use (max_completion_tokens, else
//     max_tokens, else the policy's default, times n).
//   - Ratio learns bytes per token from the backends' usage.prompt_tokens,
//     a bounded moving estimate.
//   - Meter watches an answer's bytes on their way to the client and
//     reports its usage: a JSON answer's "usage", a stream's last usage
//     chunk, else the content chunks it streamed.
//   - Limiter is the budgets' contract. ReserveAt and SettleAt are its
//     bucket maths as pure functions over stored State, in integers (see
//     bucket.go for the formulas the Redis script mirrors). Local keeps
//     the buckets in this process; dispatcher/fleet keeps them in Redis
//     with the same semantics, and internal/limitertest holds both to
//     them.
//   - Headers turns a Decision into the x-ratelimit-* headers.
//
// Nothing here imports net/http or a Kubernetes package; all time comes
// from an injected clock.
//
// Concurrency model: Estimate, ReserveAt, SettleAt and Headers are pure
// functions. Ratio and Local are safe for concurrent use (one mutex each,
// held for arithmetic only; Local forgets idle keys on its callers' calls,
// with no goroutine). A Meter belongs to one answer and is not safe for
// concurrent use; Reset readies it for another, so the server may pool
// them.
package tokens
