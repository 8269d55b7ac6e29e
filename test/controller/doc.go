// Package controller is the end-to-end suite of `tiergate controller`: a
// real kube-apiserver and etcd (envtest on bin/k8s) with the CRDs and the
// RBAC of config/, the rest of a control plane around them
// (internal/testutil/cluster: kube-controller-manager, kube-scheduler and
// kwok with one fake Node), the real tiergate binary running as the
// controller (with only its ServiceAccount's permissions) and as dispatcher
// processes, real simserver processes as the model servers, and kubectl
// applying config/samples and config/dispatcher.
//
// Nothing plays the cluster by hand: the model pods are the sample
// Deployment's, made by the ReplicaSet controller, scheduled onto the kwok
// Node and made Ready by kwok's Stages; "n ready replicas" is `kubectl
// scale deployment llm --replicas n` and the Deployment's readyReplicas as
// the Deployment controller reports it. The pods get their IPs from kwok's
// pod CIDR, and a pod network (cluster.Network) relays each Ready model
// pod's address to a simserver. The dispatcher pods are config/dispatcher's
// Deployment; a dispatcher process runs on each pod's address.
//
// kwok plays no readiness probes, so the tests whose assertions are about
// what a dispatcher's /readyz does to its pod's Ready condition
// (TestDispatcherPodsComeAndGo, TestWrongTokenDegrades,
// TestFewerSlotsThanDispatchers) run in a probed env (probe_test.go): a
// loop reads each dispatcher's /readyz and labels its pod with the answer,
// and two Stages of this suite (stages/) make kwok turn the pod Ready or
// NotReady; their template's hour-long cold start keeps kwok's own
// pod-ready Stage from making them Ready first. A container's restart
// (TestFailingDispatcherLosesItsShare/restarted: restarted a moment ago,
// running again, the pod still Ready) and its crash loop are kwok's chaos
// Stages too (cluster.RestartLabel, cluster.ChaosLabel).
//
// Tests run one after another (they share the controller process); every
// process a test starts is stopped in its Cleanup, and its namespace is
// deleted (the namespace controller runs).
package controller
