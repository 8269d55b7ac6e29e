package helm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/internal/testutil"
)

// The shared control plane: started on first use, stopped by TestMain.
var cp struct {
	once       sync.Once
	env        *envtest.Environment
	admin      *rest.Config
	kubeconfig string
	err        error
}

func controlPlane(t *testing.T) string {
	t.Helper()
	cp.once.Do(func() {
		// No CRDs: the chart installs its own.
		cp.env = &envtest.Environment{BinaryAssetsDirectory: k8sAssets}
		if _, cp.err = cp.env.Start(); cp.err != nil {
			return
		}
		user, err := cp.env.AddUser(envtest.User{Name: "helm-test-admin", Groups: []string{"system:masters"}}, nil)
		if err != nil {
			cp.err = err
			return
		}
		cp.admin = user.Config()
		kc, err := user.KubeConfig()
		if err != nil {
			cp.err = err
			return
		}
		cp.kubeconfig = filepath.Join(helmHome, "kubeconfig")
		cp.err = os.WriteFile(cp.kubeconfig, kc, 0o600)
	})
	if cp.err != nil {
		t.Fatalf("starting kube-apiserver and etcd from bin/k8s: %v", cp.err)
	}
	return cp.kubeconfig
}

func stopControlPlane() error {
	if cp.env == nil {
		return nil
	}
	return cp.env.Stop()
}

// kube is bin/k8s/kubectl against the control plane.
func kube(t *testing.T) testutil.Tool {
	t.Helper()
	return command(testutil.Kubectl(kubectlBin, controlPlane(t)))
}

// kubectl runs kube and fails the test if it fails.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return kube(t).Must(t, args...)
}

// helmKube runs bin/helm against the control plane.
func helmKube(t *testing.T, args ...string) string {
	t.Helper()
	return helm(t, append(args, "--kubeconfig", controlPlane(t))...)
}

// live lists "Kind/name" of the objects of a manifest that exist now.
func live(t *testing.T, manifest string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	out := kubectl(t, "get", "-f", path, "--ignore-not-found", "-o", `jsonpath={range .items[*]}{.kind}/{.metadata.name}{"\n"}{end}`)
	return sortedLines(out)
}

func sortedLines(s string) []string {
	lines := strings.Fields(s)
	sort.Strings(lines)
	return lines
}

func sortedNames(t *testing.T, manifest string) []string {
	t.Helper()
	n := names(parseDocs(t, manifest))
	sort.Strings(n)
	return n
}

// chartCRDs names the CRDs in charts/tiergate/crds.
func chartCRDs(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s/crds (%v)", chartDir, err)
	}
	var crds []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range parseDocs(t, string(data)) {
			crds = append(crds, o.GetName())
		}
	}
	sort.Strings(crds)
	return crds
}

func pushToken(t *testing.T, ns, secret, key string) string {
	t.Helper()
	enc := kubectl(t, "get", "secret", secret, "-n", ns, "-o", "jsonpath={.data."+key+"}")
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatalf("token of %s/%s is not base64: %v", ns, secret, err)
	}
	return string(raw)
}

func TestInstallUpgradeUninstall(t *testing.T) {
	const ns = "tg-default"
	controlPlane(t)
	kubectl(t, "create", "namespace", ns)

	notes := helmKube(t, "install", release, chartDir, "--namespace", ns)
	for _, want := range []string{
		"app.kubernetes.io/name: tiergate-dispatcher",
		"app.kubernetes.io/instance: " + release,
		"http://tiergate-dispatcher." + ns + ".svc:80/v1",
		"trustedSources: [<CIDR of the gateway that sets X-Tenant-ID>]",
		"the ModelPool carries the Warning condition\nTenantHeaderUnprotected",
		"Today the data port is open to every pod: networkPolicy.dataFrom is empty.",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("install NOTES lack %q:\n%s", want, notes)
		}
	}

	manifest := helmKube(t, "get", "manifest", release, "--namespace", ns)
	wantObjects := []string{
		"ClusterRole/tiergate-controller",
		"ClusterRoleBinding/tiergate-controller",
		"Deployment/tiergate-controller",
		"Deployment/tiergate-dispatcher",
		"NetworkPolicy/tiergate-dispatcher",
		"PodDisruptionBudget/tiergate-dispatcher",
		"Role/tiergate-controller-leader-election",
		"Role/tiergate-controller-push-token",
		"RoleBinding/tiergate-controller-leader-election",
		"RoleBinding/tiergate-controller-push-token",
		"Service/tiergate-dispatcher",
		"ServiceAccount/tiergate-controller",
		"ServiceAccount/tiergate-dispatcher",
	}
	if diff := cmp.Diff(wantObjects, sortedNames(t, manifest)); diff != "" {
		t.Errorf("released objects (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantObjects, live(t, manifest)); diff != "" {
		t.Errorf("objects in the API server after install (-want +got):\n%s", diff)
	}

	t.Run("CRDs are Established", func(t *testing.T) {
		crds := chartCRDs(t)
		if diff := cmp.Diff([]string{"modelpools.tiergate.dev", "servicetiers.tiergate.dev", "tenantquotas.tiergate.dev"}, crds); diff != "" {
			t.Errorf("chart CRDs (-want +got):\n%s", diff)
		}
		args := []string{"wait", "--for=condition=Established", "--timeout=60s"}
		for _, c := range crds {
			args = append(args, "crd/"+c)
		}
		kubectl(t, args...)
		for _, c := range crds {
			got := kubectl(t, "get", "crd", c, "-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
			if got != "True" {
				t.Errorf("CRD %s Established = %q, want True", c, got)
			}
		}
	})

	t.Run("samples apply", func(t *testing.T) {
		out := kubectl(t, "apply", "--namespace", ns, "-f", filepath.Join(repoRoot, "config", "samples"))
		if strings.Count(out, " created") < 7 {
			t.Errorf("kubectl apply -f config/samples created fewer than 7 objects:\n%s", out)
		}
		got := sortedLines(kubectl(t, "get", "modelpools,servicetiers,tenantquotas", "--namespace", ns, "-o", "name"))
		want := []string{
			"modelpool.tiergate.dev/llm",
			"servicetier.tiergate.dev/free",
			"servicetier.tiergate.dev/premium",
			"servicetier.tiergate.dev/standard",
			"tenantquota.tiergate.dev/acme",
			"tenantquota.tiergate.dev/globex",
			"tenantquota.tiergate.dev/initech",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("sample objects (-want +got):\n%s", diff)
		}
		// The sample pool must select this release's dispatcher pods.
		sel := kubectl(t, "get", "modelpool", "llm", "--namespace", ns, "-o", "jsonpath={.spec.dispatchers.selector.matchLabels}")
		var matchLabels map[string]string
		if err := json.Unmarshal([]byte(sel), &matchLabels); err != nil {
			t.Fatalf("selector %q: %v", sel, err)
		}
		podLabels := kubectl(t, "get", "deployment", "tiergate-dispatcher", "--namespace", ns, "-o", "jsonpath={.spec.template.metadata.labels}")
		var labels map[string]string
		if err := json.Unmarshal([]byte(podLabels), &labels); err != nil {
			t.Fatal(err)
		}
		for k, v := range matchLabels {
			if labels[k] != v {
				t.Errorf("the sample ModelPool selects %s=%s; the dispatcher pods have %s=%q", k, v, k, labels[k])
			}
		}
	})

	// No controller runs here, so nothing creates the token Secret.
	noTokenSecret := func(t *testing.T) {
		t.Helper()
		if out := kubectl(t, "get", "secret", "tiergate-push-token", "-n", ns, "--ignore-not-found", "-o", "name"); out != "" {
			t.Errorf("the chart made the token Secret: %s", out)
		}
	}
	noTokenSecret(t)

	t.Run("upgrade", func(t *testing.T) {
		helmKube(t, "upgrade", release, chartDir, "--namespace", ns, "--set", "dispatcher.replicas=3")
		// The upgrade did apply: the new replica count is live.
		if got := kubectl(t, "get", "deployment", "tiergate-dispatcher", "--namespace", ns, "-o", "jsonpath={.spec.replicas}"); got != "3" {
			t.Errorf("dispatcher replicas after upgrade = %s, want 3", got)
		}
		helmKube(t, "upgrade", release, chartDir, "--namespace", ns, "--reuse-values")
		noTokenSecret(t)
		var status struct {
			Version int `json:"version"`
		}
		if err := json.Unmarshal([]byte(helmKube(t, "status", release, "--namespace", ns, "-o", "json")), &status); err != nil {
			t.Fatal(err)
		}
		if status.Version != 3 {
			t.Errorf("release revision = %d, want 3", status.Version)
		}
	})

	t.Run("uninstall leaves only the CRDs", func(t *testing.T) {
		helmKube(t, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "60s")
		if left := live(t, manifest); len(left) != 0 {
			t.Errorf("objects left after uninstall: %v", left)
		}
		byLabel := kubectl(t, "get", "all,secrets,serviceaccounts,networkpolicies,poddisruptionbudgets,roles,rolebindings,configmaps",
			"--namespace", ns, "-l", "app.kubernetes.io/instance="+release, "-o", "name")
		cluster := kubectl(t, "get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance="+release, "-o", "name")
		if strings.TrimSpace(byLabel+cluster) != "" {
			t.Errorf("labelled objects left after uninstall:\n%s%s", byLabel, cluster)
		}
		for _, c := range chartCRDs(t) {
			kubectl(t, "get", "crd", c)
		}
		// The CRDs kept their objects.
		if got := kubectl(t, "get", "modelpool", "llm", "--namespace", ns, "-o", "name"); strings.TrimSpace(got) != "modelpool.tiergate.dev/llm" {
			t.Errorf("the sample ModelPool is gone after uninstall: %q", got)
		}
	})
}

// A release whose chart rendered the token Secret (an earlier chart
// version did so with the defaults) keeps it, token and all, through
// upgrades to values that leave the Secret to the controller: Helm would
// delete a Secret the new render lacks.
func TestUpgradeKeepsAChartRenderedToken(t *testing.T) {
	const ns = "tg-legacy-token"
	const token = "a-token-an-earlier-chart-generated-0123456789"
	controlPlane(t)
	kubectl(t, "create", "namespace", ns)
	helmKube(t, "install", "legacy", chartDir, "--namespace", ns, "--set", "pushToken.value="+token)
	for i := 1; i <= 2; i++ {
		helmKube(t, "upgrade", "legacy", chartDir, "--namespace", ns, "--reset-values")
		if got := pushToken(t, ns, "legacy-tiergate-push-token", "token"); got != token {
			t.Errorf("token after upgrade %d = %q, want the rendered %q", i, got, token)
		}
		if m := helmKube(t, "get", "manifest", "legacy", "--namespace", ns); !strings.Contains(m, "name: legacy-tiergate-push-token\n") {
			t.Errorf("upgrade %d: the Secret left the release", i)
		}
	}
	helmKube(t, "uninstall", "legacy", "--namespace", ns, "--wait", "--timeout", "60s")
	if out := kubectl(t, "get", "secret", "legacy-tiergate-push-token", "-n", ns, "--ignore-not-found", "-o", "name"); out != "" {
		t.Errorf("the release's Secret outlived uninstall: %s", out)
	}
}

func TestInstallAllOptions(t *testing.T) {
	const ns = "tg-all-options"
	controlPlane(t)
	values := filepath.Join(repoRoot, "test", "helm", "testdata", "all-options.yaml")
	kubectl(t, "create", "namespace", ns)
	kubectl(t, "create", "namespace", "tg-monitoring") // metrics.dashboard.namespace
	monitoring := filepath.Join(repoRoot, "test", "helm", "testdata", "monitoring-crds.yaml")
	kubectl(t, "apply", "-f", monitoring)
	t.Cleanup(func() { kubectl(t, "delete", "-f", monitoring, "--ignore-not-found") })
	kubectl(t, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")

	helmKube(t, "install", "tg-all", chartDir, "--namespace", ns, "-f", values)
	manifest := helmKube(t, "get", "manifest", "tg-all", "--namespace", ns)
	want := []string{
		"ClusterRole/tg-all-controller",
		"ClusterRoleBinding/tg-all-controller",
		"ConfigMap/tg-all-dashboard",
		"Deployment/tg-all-controller",
		"Deployment/tg-all-dispatcher",
		"NetworkPolicy/tg-all-dispatcher",
		"PodDisruptionBudget/tg-all-dispatcher",
		"PrometheusRule/tg-all",
		"Role/tg-all-controller-leader-election",
		"RoleBinding/tg-all-controller-leader-election",
		"Secret/tg-all-push-token",
		"Service/tg-all-controller-metrics",
		"Service/tg-all-dispatcher",
		"Service/tg-all-dispatcher-metrics",
		"ServiceAccount/tg-all-gateway",
		"ServiceAccount/tg-all-operator",
		"ServiceMonitor/tg-all",
	}
	if diff := cmp.Diff(want, sortedNames(t, manifest)); diff != "" {
		t.Errorf("released objects (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, live(t, manifest)); diff != "" {
		t.Errorf("objects in the API server (-want +got):\n%s", diff)
	}
	if got := kubectl(t, "get", "configmap", "tg-all-dashboard", "--namespace", "tg-monitoring", "-o", "name"); strings.TrimSpace(got) != "configmap/tg-all-dashboard" {
		t.Errorf("dashboard ConfigMap not in tg-monitoring: %q", got)
	}
	if got := pushToken(t, ns, "tg-all-push-token", "bearer"); got != "all-options-fixed-token-0123456789abcdef" {
		t.Errorf("push token = %q, want the value from the values file", got)
	}

	helmKube(t, "uninstall", "tg-all", "--namespace", ns, "--wait", "--timeout", "60s")
	if left := live(t, manifest); len(left) != 0 {
		t.Errorf("objects left after uninstall: %v", left)
	}
}

// canI asks the API server's authorizer on behalf of a ServiceAccount.
func canI(t *testing.T, sa string, args ...string) bool {
	t.Helper()
	r := kube(t).Run(append([]string{"auth", "can-i", "--as", sa}, args...)...)
	switch out := strings.TrimSpace(r.Stdout); {
	case r.Err == nil && out == "yes":
		return true
	case exitedNonZero(r) && strings.HasPrefix(out, "no"):
		return false
	default:
		t.Fatalf("kubectl auth can-i %s:\n%s", strings.Join(args, " "), r)
		return false
	}
}

func TestRBAC(t *testing.T) {
	const ns = "tg-rbac"
	controlPlane(t)
	kubectl(t, "create", "namespace", ns)
	helmKube(t, "install", "rbac", chartDir, "--namespace", ns)
	t.Cleanup(func() { helmKube(t, "uninstall", "rbac", "--namespace", ns, "--wait", "--timeout", "60s") })
	controller := "system:serviceaccount:" + ns + ":rbac-tiergate-controller"
	dispatcher := "system:serviceaccount:" + ns + ":rbac-tiergate-dispatcher"
	// kubectl auth can-i resolves a resource through discovery: KEDA's own
	// ScaledObject CRD (hack/tools.sh keda) makes scaledobjects.keda.sh one.
	kedaCRD := filepath.Join(repoRoot, "bin", "keda", "keda.sh_scaledobjects.yaml")
	kubectl(t, "apply", "--server-side", "-f", kedaCRD)
	kubectl(t, "wait", "--for=condition=Established", "--timeout=30s", "crd/scaledobjects.keda.sh")

	tests := map[string]struct {
		sa   string
		args []string
		want bool
	}{
		"controller lists pools everywhere":       {controller, []string{"list", "modelpools.tiergate.dev", "-A"}, true},
		"controller watches tiers everywhere":     {controller, []string{"watch", "servicetiers.tiergate.dev", "-A"}, true},
		"controller gets quotas":                  {controller, []string{"get", "tenantquotas.tiergate.dev", "-n", "default"}, true},
		"controller updates pool status":          {controller, []string{"update", "modelpools.tiergate.dev", "--subresource=status", "-A"}, true},
		"controller patches tier status":          {controller, []string{"patch", "servicetiers.tiergate.dev", "--subresource=status", "-A"}, true},
		"controller patches quota status":         {controller, []string{"patch", "tenantquotas.tiergate.dev", "--subresource=status", "-A"}, true},
		"controller cannot edit pool specs":       {controller, []string{"update", "modelpools.tiergate.dev", "-A"}, false},
		"controller cannot create pools":          {controller, []string{"create", "modelpools.tiergate.dev", "-n", "default"}, false},
		"controller cannot delete tiers":          {controller, []string{"delete", "servicetiers.tiergate.dev", "-n", "default"}, false},
		"controller watches deployments":          {controller, []string{"watch", "deployments.apps", "-A"}, true},
		"controller cannot patch deployments":     {controller, []string{"patch", "deployments.apps", "-A"}, false},
		"controller lists pods":                   {controller, []string{"list", "pods", "-A"}, true},
		"controller cannot delete pods":           {controller, []string{"delete", "pods", "-A"}, false},
		"controller reads secrets":                {controller, []string{"get", "secrets", "-A"}, true},
		"controller lists secrets":                {controller, []string{"list", "secrets", "-A"}, true},
		"controller watches secrets":              {controller, []string{"watch", "secrets", "-A"}, true},
		"controller creates the token Secret":     {controller, []string{"create", "secrets", "-n", ns}, true},
		"controller no secrets elsewhere":         {controller, []string{"create", "secrets", "-n", "default"}, false},
		"controller updates the token Secret":     {controller, []string{"update", "secrets/rbac-tiergate-push-token", "-n", ns}, true},
		"controller cannot update other secrets":  {controller, []string{"update", "secrets/db-creds", "-n", ns}, false},
		"controller cannot patch secrets":         {controller, []string{"patch", "secrets/rbac-tiergate-push-token", "-n", ns}, false},
		"controller cannot delete secrets":        {controller, []string{"delete", "secrets", "-n", ns}, false},
		"controller creates core events here":     {controller, []string{"create", "events", "-n", ns}, true},
		"controller no core events elsewhere":     {controller, []string{"create", "events", "-n", "default"}, false},
		"controller patches events.k8s.io events": {controller, []string{"patch", "events.events.k8s.io", "-n", "default"}, true},
		"controller gets its lease":               {controller, []string{"get", "leases.coordination.k8s.io", "-n", ns}, true},
		"controller creates its lease":            {controller, []string{"create", "leases.coordination.k8s.io", "-n", ns}, true},
		"controller updates its lease":            {controller, []string{"update", "leases.coordination.k8s.io", "-n", ns}, true},
		"controller cannot delete leases":         {controller, []string{"delete", "leases.coordination.k8s.io", "-n", ns}, false},
		"controller no leases elsewhere":          {controller, []string{"create", "leases.coordination.k8s.io", "-n", "default"}, false},
		"controller creates scaledobjects":        {controller, []string{"create", "scaledobjects.keda.sh", "-n", "default"}, true},
		"controller updates scaledobjects":        {controller, []string{"update", "scaledobjects.keda.sh", "-A"}, true},
		"controller deletes scaledobjects":        {controller, []string{"delete", "scaledobjects.keda.sh", "-A"}, true},
		"controller gets scaledobjects":           {controller, []string{"get", "scaledobjects.keda.sh", "-A"}, true},
		"controller cannot patch scaledobjects":   {controller, []string{"patch", "scaledobjects.keda.sh", "-A"}, false},
		"controller no hpas":                      {controller, []string{"create", "horizontalpodautoscalers.autoscaling", "-A"}, false},
		"dispatcher cannot touch scaledobjects":   {dispatcher, []string{"get", "scaledobjects.keda.sh", "-n", ns}, false},
		"controller reads JWKS configmaps":        {controller, []string{"watch", "configmaps", "-A"}, true},
		"controller cannot write configmaps":      {controller, []string{"update", "configmaps", "-n", ns}, false},
		"controller cannot list nodes":            {controller, []string{"list", "nodes"}, false},
		"dispatcher cannot read pools":            {dispatcher, []string{"get", "modelpools.tiergate.dev", "-n", ns}, false},
		"dispatcher cannot read pods":             {dispatcher, []string{"list", "pods", "-n", ns}, false},
		"dispatcher cannot read secrets":          {dispatcher, []string{"get", "secrets", "-n", ns}, false},
		"dispatcher cannot read endpoints":        {dispatcher, []string{"list", "endpointslices.discovery.k8s.io", "-n", ns}, false},
		"dispatcher cannot take leases":           {dispatcher, []string{"create", "leases.coordination.k8s.io", "-n", ns}, false},
		"dispatcher cannot create events":         {dispatcher, []string{"create", "events", "-n", ns}, false},
		"dispatcher cannot read configmaps":       {dispatcher, []string{"get", "configmaps", "-n", ns}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := canI(t, tc.sa, tc.args...); got != tc.want {
				t.Errorf("can-i %s as %s = %v, want %v", strings.Join(tc.args, " "), tc.sa, got, tc.want)
			}
		})
	}

	t.Run("nothing binds the dispatcher", func(t *testing.T) {
		var list struct {
			Items []struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Subjects []struct {
					Kind, Name, Namespace string
				} `json:"subjects"`
			} `json:"items"`
		}
		if err := json.Unmarshal([]byte(kubectl(t, "get", "rolebindings,clusterrolebindings", "-A", "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		for _, b := range list.Items {
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == "rbac-tiergate-dispatcher" {
					t.Errorf("%s %s binds the dispatcher ServiceAccount", b.Kind, b.Metadata.Name)
				}
			}
		}
	})

	t.Run("the controller runs as its ServiceAccount", func(t *testing.T) {
		kubectl(t, "apply", "--namespace", ns, "-f", filepath.Join(repoRoot, "config", "samples"))
		runControllerAsServiceAccount(t, ns, "rbac")
	})

	t.Run("leader election as the controller", func(t *testing.T) {
		leaderElection(t, ns, controller)
	})

	t.Run("lease writes outside the grant are Forbidden", func(t *testing.T) {
		tests := map[string]struct{ sa, ns string }{
			"dispatcher in the release namespace": {dispatcher, ns},
			"controller in another namespace":     {controller, "default"},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				cs := impersonate(t, tc.sa)
				lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tiergate-forbidden", Namespace: tc.ns}}
				_, err := cs.CoordinationV1().Leases(tc.ns).Create(context.Background(), lease, metav1.CreateOptions{})
				if !apierrors.IsForbidden(err) {
					t.Errorf("creating a Lease in %s as %s: err = %v, want Forbidden", tc.ns, tc.sa, err)
				}
			})
		}
	})
}

// impersonate is a clientset acting as a ServiceAccount, with the groups the
// API server gives real ServiceAccount tokens.
func impersonate(t *testing.T, sa string) *kubernetes.Clientset {
	t.Helper()
	cfg := rest.CopyConfig(cp.admin)
	ns := strings.Split(sa, ":")[2]
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// leaderElection runs client-go's Lease lock, which controller-runtime uses
// for --leader-elect, as sa: it must acquire the Lease and release it.
func leaderElection(t *testing.T, ns, sa string) {
	t.Helper()
	cs := impersonate(t, sa)
	const name = "tiergate-leader-test"
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, name,
		cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: "helm-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	led := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     time.Second,
		ReleaseOnCancel: true,
		Name:            name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(led) },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		defer close(done)
		elector.Run(runCtx)
	}()
	select {
	case <-led:
	case <-ctx.Done():
		stop()
		<-done
		t.Fatalf("%s did not acquire Lease %s/%s within 30s", sa, ns, name)
	}
	stop()
	<-done // Run returns after releasing the Lease (an Update)
	got, err := adminClientset(t).CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder := "<nil>"
	if h := got.Spec.HolderIdentity; h != nil {
		holder = *h
	}
	if holder != "" {
		t.Errorf("Lease holder after release = %q, want empty (the release is an update the role must allow)", holder)
	}
}

func adminClientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cp.admin)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
