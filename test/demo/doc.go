// Package demo tests `make demo` end to end: it builds hack/demo, runs the
// short demo (--duration 30s, what `make demo DURATION=30s` runs) as a real
// process against the real control plane in bin/k8s, and checks the report
// (Markdown, summary.json, PNG charts that decode), the numbers in it
// (every tier served, refusals recorded and counted alike by client and
// dispatchers, bounds that followed the 6→3→6 scale to the exact values of
// the seed's worked example, the tenant over its tokens budget refused
// with rate_limited, retrying after Retry-After and using no more tokens
// than its budget admits) and that no process the demo started
// survives it, by PID, by process group and by command line. A second test
// interrupts a run with SIGINT sent to its process group, as a terminal's
// Ctrl-C does, and checks the same cleanup.
//
// Concurrency model: the tests run one after the other (no t.Parallel);
// each starts one demo process and one goroutine that waits for it.
package demo
