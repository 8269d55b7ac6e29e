// Package cluster is the end-to-end suite on a real cluster around the
// test API server: kube-apiserver and etcd (envtest on bin/k8s, with the
// ServiceAccount admission plugin on), the real kube-controller-manager and
// kube-scheduler, and kwok playing the pods on fake Nodes through the
// Stages of internal/testutil/cluster. Model pods get addresses from a
// 127.88.N.0/24 pod CIDR; a cluster.Network listens on each of them and
// relays to one real simserver process on 127.0.0.1, so what is sent to a
// pod IP reaches a model server. No test here creates a Pod or writes a
// status: Deployments are applied and scaled with kubectl, and the
// controllers and kwok do the rest. TestModelPoolFollowsScale adds the
// real tiergate controller (as the cluster's admin) and two dispatcher
// processes on the addresses kwok gave config/dispatcher's pods, and so
// do the other pool tests (startPool): TestScaleFromZero (6 -> 0 -> 6 with
// spec.coldStart and a 10s cold start: premium refused at once, standard
// and free held, then served), TestRollingUpdate (`kubectl rollout
// restart` with surge 25% and unavailable 0: bounds within the listed
// backends, every request answered, no work for a terminating pod, told
// by the bytes the pod network counts per address) and TestChaosPodFails
// (a pod crashed by the chaos label: ejected, dropped and taken back, no
// request lost). Each step's duration is logged.
//
// One thing this cluster cannot do: the API server refuses loopback
// addresses in EndpointSlices, so a Service over these pods has an empty
// EndpointSlice (TestDeploymentOnKwok pins the refusal).
//
// Tests run one after another, each in a namespace of its own; the
// control plane, the cluster and simserver are shared and started once in
// TestMain, which stops them all.
package cluster
