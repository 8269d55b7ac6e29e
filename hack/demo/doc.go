// Command demo is `make demo`: tiergate end to end on one machine, with
// nothing but the binaries of this repository and bin/k8s.
//
// It builds `tiergate` and the simserver (a STAND-IN for vLLM) into a work
// directory, starts a real etcd and kube-apiserver from bin/k8s (envtest),
// installs the CRDs and applies config/samples (plus the demo's extra
// tenants in hack/demo/manifests) and config/dispatcher with the real
// bin/k8s/kubectl. The rest of a cluster runs around the API server
// (kwok.go, through internal/testutil/cluster): the real
// kube-controller-manager and kube-scheduler, and kwok, which runs three
// fake Nodes and plays the pods bound to them: addresses of a loopback
// /24, Ready a cold start after they started, removed a while after their
// deletion began. No Pod or status is written by the demo. The model pods'
// addresses are served by a pod network that relays to one simserver
// process sized for the whole pool (so what a replica carried is the
// network's count for its address); the two `tiergate dispatcher`
// processes listen on the addresses kwok gave the dispatcher pods. It then
// runs `tiergate controller` with a kubeconfig and leader election, drives
// a mixed load (steady and noisy premium tenants, standard tenants, an
// openai-go client that honours Retry-After, a standard tenant over its
// tokens budget whose openai-go workers back off on Retry-After and pace
// on the x-ratelimit-* headers (budget.go), a free-tier flood), shows a
// per-tier table every second, and scales the pool 6→3→6 as an autoscaler
// does: `kubectl scale` writes the Deployment's spec.replicas, the
// ReplicaSet controller deletes or creates pods, and the bounds follow the
// readiness the Deployment controller counts. Then a scale-from-zero phase
// (zero.go): the pool gets spec.coldStart and kwok's Stage the same cold
// start, a lighter load runs, `kubectl scale` takes the pool to 0 (the
// dispatchers hold what the bounds at zero allow and refuse premium at
// once), then to 1, whose pod is Ready a cold start later, then to 6. Last
// a token-fairness phase (fair.go): two tenants of
// the standard tier whose prompts differ 40× (the tier's tenantShare set
// to 1 first), each with as many closed-loop openai-go workers asking
// simserver for a service time proportional to their tokens, first in
// fairness mode Requests, then, after `kubectl patch modelpool` and once
// every dispatcher holds it, in mode Tokens. It writes demo-report/:
// README.md, summary.json and PNG charts rendered with gonum/plot, the
// phases' own among them (zero_report.go, fair_report.go), and what ran
// (pods.go: the components' binaries and versions, each model pod's
// owner, node and status writers, each address's traffic).
//
// Every child runs in its own process group (and gets SIGKILL if the demo
// dies, through PR_SET_PDEATHSIG); the demo stops them all on exit, on
// SIGINT and on SIGTERM: the load first, then SIGTERM to each group, SIGKILL
// after a timeout, then kwok, kube-scheduler and kube-controller-manager
// (groups of their own, without PR_SET_PDEATHSIG), then etcd and
// kube-apiserver. A second signal kills everything at once. --pid-file records every process the demo started, for tests.
//
// Concurrency model: the main goroutine runs the phases in order. During
// the load phase, one goroutine per load stream issues requests (one
// goroutine per request), one goroutine per openai-go worker, one observer
// goroutine scrapes the dispatchers every second, one goroutine per scale
// event follows it (the Deployment's readiness, the dispatchers' bounds,
// the ServiceTier status), the pod network serves each address from
// goroutines of its own, and the main goroutine runs the scale schedule
// and redraws the table; the scale-from-zero phase
// runs the same way afterwards, with its own load, recorder and observer,
// and so does the token-fairness phase (one goroutine per worker, one
// observer and one goroutine reading the simserver's /debug/stats every
// second; the main goroutine patches the pool and polls the dispatchers'
// policies). Shared state (the request records, the observer's samples,
// the simserver's samples, the event log, the process list, the pods seen)
// is guarded by one mutex per owner; nothing else is shared.
package main
