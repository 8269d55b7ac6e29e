// Command demo is `make demo`: tiergate end to end on one machine, with
// nothing but the binaries of this repository and bin/k8s.
//
// It builds `tiergate` and the simserver (a STAND-IN for vLLM) into a work
// directory, starts a real etcd and kube-apiserver from bin/k8s (envtest),
// installs the CRDs and applies config/samples (plus the demo's extra
// tenants in hack/demo/manifests) with the real bin/k8s/kubectl, and plays
// the kubelet: Pod objects whose status it sets (pod IPs on 127.0.K.x,
// Ready) for six simserver replicas and two dispatchers that run as local
// processes on those addresses. It then runs `tiergate controller` with a
// kubeconfig and leader election, drives a mixed load (steady and noisy
// premium tenants, standard tenants, an openai-go client that honours
// Retry-After, a standard tenant over its tokens budget whose openai-go
// workers back off on Retry-After and pace on the x-ratelimit-* headers
// (budget.go), a free-tier flood), shows a per-tier table every second,
// scales the pool 6→3→6 by patching the Deployment status (and marking
// model pods NotReady/Ready). Then a scale-from-zero phase (zero.go): the
// pool gets spec.coldStart, a lighter load runs, the pool goes to 0 ready
// replicas (the dispatchers hold what the bounds at zero allow and refuse
// premium at once), the first replica comes a cold start later and the
// rest after it. Last a token-fairness phase (fair.go): two tenants of
// the standard tier whose prompts differ 40× (the tier's tenantShare set
// to 1 first), each with as many closed-loop openai-go workers asking
// simserver for a service time proportional to their tokens, first in
// fairness mode Requests, then, after `kubectl patch modelpool` and once
// every dispatcher holds it, in mode Tokens. It writes demo-report/:
// README.md, summary.json and PNG charts rendered with gonum/plot, the
// phases' own among them (zero_report.go, fair_report.go).
//
// Every child runs in its own process group (and gets SIGKILL if the demo
// dies, through PR_SET_PDEATHSIG); the demo stops them all on exit, on
// SIGINT and on SIGTERM: the load first, then SIGTERM to each group, SIGKILL
// after a timeout, then the control plane. A second signal kills everything
// at once. --pid-file records every process the demo started, for tests.
//
// Concurrency model: the main goroutine runs the phases in order. During
// the load phase, one goroutine per load stream issues requests (one
// goroutine per request), one goroutine per openai-go worker, one observer
// goroutine scrapes the dispatchers every second, one kubelet goroutine
// probes pods and writes their Ready condition, and the main goroutine runs
// the scale schedule and redraws the table; the scale-from-zero phase
// runs the same way afterwards, with its own load, recorder and observer,
// and so does the token-fairness phase (one goroutine per worker, one
// observer and one goroutine reading the simservers' /debug/stats every
// second; the main goroutine patches the pool and polls the dispatchers'
// policies). Shared state (the request records, the observer's samples,
// the simservers' samples, the event log, the process list) is guarded by
// one mutex per owner; nothing else is shared.
package main
