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
// TestHelmChartOnKwok installs charts/tiergate with helm and checks its
// objects on the cluster (pods, ServiceAccounts, probes, resources, the
// PDB's status and evictions, the Service), then plays the kubelet for the
// chart's pods (chartpods_test.go): the real tiergate binary runs with the
// args and env of the Pod object the cluster made, listening on its pod IP,
// with its Secret, ConfigMap and projected volumes made from the API
// objects into temporary directories whose paths replace the mount paths.
// The controller authenticates with a TokenRequest token of its pod's
// ServiceAccount (a kubeconfig standing for in-cluster config), so the
// chart's RBAC is what allows or refuses it, and leads through the
// release's Lease. With config/samples' pool applied it pushes the policy
// to the chart's dispatcher processes, which serve completions; the
// declared probes, sent by the test (kwok plays none), answer 200.
//
// One thing this cluster cannot do: the API server refuses loopback
// addresses in EndpointSlices, so a Service over these pods has an empty
// EndpointSlice (TestDeploymentOnKwok pins the refusal).
//
// Tests run one after another, each in a namespace of its own; the
// control plane, the cluster and simserver are shared and started once in
// TestMain, which stops them all.
package cluster
