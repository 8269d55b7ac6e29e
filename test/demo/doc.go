// Package demo tests `make demo` end to end: it builds hack/demo, runs the
// short demo (--duration 30s, what `make demo DURATION=30s` runs) as a real
// process against the real control plane in bin/k8s (kube-apiserver,
// etcd, kube-controller-manager, kube-scheduler and kwok), checks what ran
// (cluster_test.go: the components' binaries and versions, every model pod
// made by the Deployment's ReplicaSet, bound to a kwok Node, its status
// written by kwok alone and its address carrying load; each scale a
// `kubectl scale` that the ReplicaSet controller turned into 3 pods, with
// spec.replicas owned by kubectl through the scale subresource), and
// checks the report (Markdown, summary.json, PNG charts that decode), the
// numbers in it
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
