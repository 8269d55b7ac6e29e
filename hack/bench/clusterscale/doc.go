// Package clusterscale measures how the tiergate controller and its
// dispatchers follow a large model Deployment on a kwok cluster: the
// "Cluster scale" figure of docs/benchmarks.md, run by `make
// bench-cluster`.
//
// TestClusterScale starts kube-apiserver and etcd (package controlplane),
// kube-controller-manager, kube-scheduler and kwok with fake Nodes
// (package cluster), simserver behind a loopback pod network of a /21,
// the real `tiergate controller` and one real `tiergate dispatcher`
// process on each dispatcher pod's address; it applies config/samples'
// pool and tiers, SCALE_QUOTAS TenantQuotas and the sample model
// Deployment at SCALE_PODS replicas, then scales that Deployment with
// kubectl to half and back SCALE_ROUNDS times. It runs only when
// TIERGATE_CLUSTER_SCALE=1, so `make test` skips it: a run takes minutes
// and both cores. It is a test rather than a program because it reuses
// the suites' helpers (which take a testing.TB) and their Cleanup, which
// stops every process it started whatever fails.
//
// Per change it records when a pod watch counted the new number of Ready,
// non-terminating pods (the readiness change), when each dispatcher's
// log shows it applied the policy it then kept (the new number of
// backends, and slots adding up to the pool's), the controller's CPU
// time and peak RSS from /proc, and the controller's API requests twice:
// from its own client-go metric rest_client_requests_total (by method:
// GET reads, the rest writes) and from the API server's audit log, which
// logs the controller's user only (kube-apiserver's
// apiserver_request_total has no label for the client).
//
// SCALE_PROFILE=dir also takes a CPU profile of the controller over
// SCALE_PROFILE_FOR (20s) from each `kubectl scale` (its
// --pprof-bind-address); SCALE_CONTROLLER_LOG=file runs it at
// --zap-log-level=debug and writes its whole log there at the end.
//
// The files without _test are pure parsing and arithmetic over those
// sources (dispatcher log lines, /proc, metrics, audit events), unit
// tested on their own.
//
// Concurrency model: the test drives everything from its goroutine; the
// pool watch's informer handlers and the RSS sampler run on goroutines of
// their own and guard what they record with a mutex each.
package clusterscale
