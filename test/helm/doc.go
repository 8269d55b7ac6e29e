// Package helm tests charts/tiergate with the real tools: bin/helm for lint,
// template, install, upgrade and uninstall, bin/k8s/kubectl for reading the
// result back, promtool (Debian package prometheus) for the alert rules, and
// a real kube-apiserver and etcd from bin/k8s started through envtest.
//
//   - lint_test.go: helm lint, also --strict, with the default and the
//     all-options values.
//   - golden_test.go: helm template output against testdata/*.golden. Run
//     `go test ./test/helm -run TestGolden -update` to rewrite them. No
//     render holds a random token (the controller creates the Secret), so
//     two renders are byte for byte the same.
//   - render_test.go: properties of the rendered objects (ports, flags,
//     mounts, security contexts, RBAC subjects) and every refusal of bad
//     values, by its exact message.
//   - rules_test.go: the PrometheusRule passes promtool check rules, its
//     alerts fire (and stay quiet) on synthetic series under promtool test
//     rules, and every metric and label the rules and the dashboard use is
//     one that dispatcher/metrics really exports.
//   - docs_test.go: README and values.schema.json cover every value; the
//     chart's CRDs equal config/crd/bases; its ClusterRole grants what
//     config/rbac/role.yaml grants.
//   - install_test.go: against envtest (no kubelet and no controllers, so
//     Deployments exist but never run, except while TestRBAC runs the
//     controller as its ServiceAccount: then cluster_test.go runs
//     kube-controller-manager, kube-scheduler and kwok, so the sample
//     Deployment's pods are the ReplicaSet's, Ready by kwok, and its
//     readyReplicas the Deployment controller's): install, every object exists, the
//     CRDs are Established, kubectl apply -f config/samples, RBAC as seen by
//     the API server's authorizer (including a real client-go leader
//     election as the controller's ServiceAccount), upgrade keeps the token
//     Secret an earlier chart generated, uninstall leaves only the CRDs. The all-options install runs too; its
//     ServiceMonitor and PrometheusRule are stored through minimal
//     stand-in CRDs (testdata/monitoring-crds.yaml) that accept any spec,
//     so their schema is checked by promtool and by the goldens, not by the
//     API server.
//   - token_test.go: `helm template` twice, both applied, then the real
//     controller (as the chart's ServiceAccount) creates the push token
//     Secret and the real dispatcher, reading it from a volume laid out and
//     swapped as the kubelet does, takes its pushes through a rotation; a
//     token the dispatcher refuses shows as Synced=False PushUnauthorized.
//
// Concurrency: tests run sequentially (none calls t.Parallel); the envtest
// control plane is started once, on first use, and stopped by TestMain.
package helm
