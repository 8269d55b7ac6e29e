// Command simserver is a stand-in for vLLM used by tiergate's tests, demo
// and benchmarks. It is NOT a model server: it generates placeholder tokens.
//
// It speaks the parts of the OpenAI-compatible API that tiergate proxies:
// POST /v1/chat/completions and /v1/completions (streaming SSE with
// "data: {...}" chunks closed by "data: [DONE]", and non-streaming JSON),
// POST /v1/embeddings, GET /v1/models and GET /health. Like vLLM's
// --max-num-seqs it generates at most --concurrency requests at once and
// queues the rest in its own FIFO. Each request's service time is drawn
// from --service-time and its tokens are streamed at a steady rate over
// that time.
//
// Tokens are modelled so that token budgets can be tested: a prompt counts
// ceil(bytes / --bytes-per-token) tokens, an answer has --output-tokens
// tokens (at most the request's maximum, times n), and every answer reports
// them in usage as vLLM does (a stream in its last chunk, when asked with
// stream_options.include_usage). With --prefill-tokens-per-second and
// --decode-tokens-per-second the service time is prompt/prefill +
// output/decode instead: the first token after the prefill and one decode
// step, then one per decode step.
//
// For tests it records, per tenant (read from the X-Tiergate-Tenant header
// that the dispatcher sets) and overall, the current and peak number of
// requests inside the server, the number of requests whose client went
// away before the answer was complete, and the prompt and completion tokens
// served. GET /debug/stats returns them as
// JSON; POST /debug/stats/reset zeroes them.
//
// Concurrency model: one goroutine per HTTP request (net/http). The
// generation slots are a mutex-guarded counter with a FIFO of waiters; the
// statistics are guarded by one mutex. Nothing polls.
package main
