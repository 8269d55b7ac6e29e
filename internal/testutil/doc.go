// Package testutil is the plumbing the process-level suites under test/
// (and test helpers such as internal/redistest) share: building the
// binaries under test, running child processes with their output captured
// and stopping them with SIGTERM then SIGKILL, picking free loopback ports,
// and waiting for a condition with a deadline. Its sub-package
// controlplane starts a real kube-apiserver and etcd (envtest on bin/k8s).
//
// It is for tests only: importing it pulls in package testing, so no
// program may import it.
//
// Concurrency model: a Process may be read (Output, Exited, Done) from any
// goroutine while it runs; its output buffer is guarded by a mutex and its
// exit is published by closing Done. Stop, Kill and KillGroup may be called
// from any goroutine and more than once. The other helpers hold no state.
package testutil
