// Package testutil is the plumbing the process-level suites under test/
// (and test helpers such as internal/redistest) share: building the
// binaries under test, running child processes with their output captured
// and stopping them with SIGTERM then SIGKILL, waiting on what a process
// writes, starting a simserver or a dispatcher (with a policy and an admin
// token) and talking to its admin API, scraping /metrics, running kubectl
// and helm with a time bound, picking free loopback ports, and waiting for
// a condition with a deadline. Its sub-package controlplane starts a real
// kube-apiserver and etcd (envtest on bin/k8s).
//
// It is for tests only: importing it pulls in package testing, so no
// program may import it. It imports no package of the product, so any
// product package's tests may use it.
//
// Concurrency model: a Process may be read (Output, Exited, Done,
// AwaitOutput) from any goroutine while it runs; its output buffer is
// guarded by a mutex, every write wakes the goroutines waiting on the
// output, and its exit is published by closing Done. Stop, Kill and
// KillGroup may be called from any goroutine and more than once. A Tool
// holds no state between runs; a Simserver or Dispatcher is its Process
// plus addresses. The other helpers hold no state.
package testutil
