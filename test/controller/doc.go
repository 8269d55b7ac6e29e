// Package controller is the end-to-end suite of `tiergate controller`: a
// real kube-apiserver and etcd (envtest on bin/k8s) with the CRDs and the
// RBAC of config/, the real tiergate binary running as the controller (with
// only its ServiceAccount's permissions) and as dispatcher processes on
// 127.77.N.x, real simserver processes as model replicas, and kubectl
// applying config/samples. Pods are objects whose status the tests set: a
// small loop plays the kubelet's readiness probe against each dispatcher's
// /readyz. The Deployment's status.readyReplicas is patched to play the
// autoscaler.
//
// Tests run one after another (they share the controller process); every
// process a test starts is stopped in its Cleanup.
package controller
