// Package integration holds the suites that need a real control plane: a
// kube-apiserver and etcd from bin/k8s (built by `make tools`), started once
// per test binary through envtest, and the real bin/k8s/kubectl.
//
// It checks the API as the API server enforces it: the CRDs install and
// become Established, the samples apply with kubectl, and every bad object
// is refused with its exact message. Tests run in parallel, each in a
// namespace of its own, against the one shared API server.
package integration
