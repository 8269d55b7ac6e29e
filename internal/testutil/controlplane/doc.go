// Package controlplane starts a real kube-apiserver and etcd for the
// process-level suites: envtest on the binaries of bin/k8s (or
// KUBEBUILDER_ASSETS), with the CRDs of config/crd/bases installed, and
// writes kubeconfig files for it. It is apart from package testutil so that
// tests which only run processes do not link the Kubernetes client stack.
//
// Concurrency model: the functions hold no state; an Environment is
// started and stopped by one goroutine (the suite's TestMain).
package controlplane
