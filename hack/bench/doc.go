// Package bench holds the dispatcher's load benchmarks, run by
// hack/bench-dispatcher.sh (make bench). They are ordinary go test
// benchmarks that drive already-running servers named by environment
// variables, and they skip when those are not set:
//
//	BENCH_DIRECT, BENCH_REVERSEPROXY, BENCH_NGINX, BENCH_TIERGATE
//	    host:port of simserver (zero service time) and the three proxies
//	    in front of it; each target is measured in the same run.
//	BENCH_OVERLOAD      a tiergate whose pool is small (for 429 latency)
//	BENCH_OVERLOAD_RATE its capacity in requests/s
//	BENCH_BEFORE, BENCH_OVERLOAD_BEFORE
//	    optional: the same two, served by tiergate built from an older
//	    revision (target "before"), for before and after in one run
//	BENCH_QUEUE, BENCH_QUEUE_ADMIN, BENCH_QUEUE_PID
//	    a tiergate whose only slot is held, for memory per queued request
//
// BenchmarkFirstByte times the first event of streamed answers through
// BENCH_DIRECT and the proxies. hack/bench-dispatcher.sh also runs vegeta
// against the same targets in each round (hack/bench/vegetastat turns its
// results into benchmark lines for hack/bench/summarize).
//
// Every load loop is bounded by b.N and by a deadline, and talks only to
// loopback addresses. The load generator is in this package (load.go).
//
// Concurrency: each benchmark runs a fixed set of client goroutines that
// record latencies into their own slices; results are merged at the end.
package bench
