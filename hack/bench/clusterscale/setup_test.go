package clusterscale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

// controllerUser is the user the tiergate controller authenticates as,
// alone, so the audit log tells its requests from the other components'.
const controllerUser = "tiergate-scale-controller"

// ns is the namespace of the pool, its tiers, quotas and Deployments.
const ns = "scale"

// bench is everything a run sets up.
type bench struct {
	cfg      config
	root     string
	env      *envtest.Environment
	k8s      client.Client
	kc       *cluster.Cluster
	kubectl  testutil.Tool
	podNet   *cluster.Network
	auditLog string

	ctrl        *testutil.Process
	ctrlMetrics string
	ctrlPprof   string // "" unless cfg.Profile
	ds          []*testutil.Dispatcher
	pool        *poolWatch
	rss         *rssPeak
	// current is the model Deployment's replicas.
	current int
}

// setUp starts the control plane with an audit log of the controller's
// requests, the cluster (kwok Nodes, kube-controller-manager,
// kube-scheduler), simserver behind the pod network, the tiergate
// controller, the pool's objects at cfg.Pods replicas and a dispatcher
// process on each dispatcher pod. Cleanup stops all of it.
func setUp(t *testing.T, cfg config) *bench {
	t.Helper()
	b := &bench{cfg: cfg}
	var err error
	if b.root, err = testutil.ModuleRoot(); err != nil {
		t.Fatal(err)
	}
	assets, err := controlplane.Assets(b.root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	checkFileLimit(t, cfg.PodCIDR)
	bins, err := testutil.BuildBinaries(dir, testutil.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.startControlPlane(t, assets, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	started := time.Now()
	b.kc, err = cluster.Start(ctx, b.env, b.env.Config, cluster.Options{
		Assets:    assets,
		StageCRD:  filepath.Join(b.root, "bin", "kwok", "kwok.x-k8s.io_stages.yaml"),
		Dir:       filepath.Join(dir, "cluster"),
		Nodes:     cfg.Nodes,
		PodCIDR:   cfg.PodCIDR,
		Stages:    cluster.StageOptions{ColdStart: cfg.ColdStart, TerminationDelay: cfg.TerminationDelay},
		StopGrace: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.kc.Stop(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	})
	t.Logf("cluster: %d Nodes Ready in %s, pod CIDR %s", cfg.Nodes, time.Since(started).Round(time.Millisecond), b.kc.PodCIDR)
	b.kubectl = testutil.Kubectl(filepath.Join(assets, "kubectl"), b.kc.Kubeconfig)
	sim := testutil.StartSimserver(t, bins.Simserver, testutil.SimOptions{
		Options: testutil.Options{Name: "simserver", Grace: 5 * time.Second, LogBytes: 4000},
		Args:    []string{"--concurrency", "64", "--service-time", "const:20ms"},
	})
	if b.podNet, err = b.kc.Network(ctx, 0, sim.Addr); err != nil {
		t.Fatal(err)
	}
	b.startPool(t, bins, dir)
	return b
}

func (b *bench) startControlPlane(t *testing.T, assets, dir string) {
	t.Helper()
	policy := filepath.Join(dir, "audit-policy.yaml")
	b.auditLog = filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policy, fmt.Appendf(nil, auditPolicy, controllerUser), 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	opts := append(cluster.APIServerOptions(),
		controlplane.WithAPIServerFlag("audit-policy-file", policy),
		controlplane.WithAPIServerFlag("audit-log-path", b.auditLog),
		controlplane.WithAPIServerFlag("audit-log-format", "json"),
	)
	env, cfg, err := controlplane.Start(b.root, assets, scheme, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b.env = env
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	if b.k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
}

// auditPolicy logs the metadata of the controller's requests, nothing
// else: the log costs the API server little, whatever the other
// components do.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [%q]
  - level: None
`

// checkFileLimit fails unless this process may open a descriptor for
// every address of the pod network and a margin for the clients.
func checkFileLimit(t *testing.T, cidr string) {
	t.Helper()
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		t.Fatal(err)
	}
	need := uint64(1<<(32-p.Bits())) + 4096
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Go raised the soft limit to the hard one at start-up.
	if lim.Cur < need {
		t.Fatalf("open files limit %d (hard %d): the pod network %s needs about %d; raise ulimit -n", lim.Cur, lim.Max, cidr, need)
	}
}

// startPool creates the namespace, starts the controller and applies the
// tiers, the quotas, the pool, the model Deployment and the dispatcher
// Deployment, then runs a dispatcher process on each dispatcher pod.
func (b *bench) startPool(t *testing.T, bins testutil.Binaries, dir string) {
	t.Helper()
	b.kubectl.Must(t, "create", "namespace", ns)
	testutil.Eventually(t, 30*time.Second, "the default ServiceAccount", func() error {
		return b.k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "default"}, &corev1.ServiceAccount{})
	})
	token := filepath.Join(dir, "push-token")
	if err := os.WriteFile(token, []byte("cluster-scale-push-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminPort, dataPort := b.dispatcherPorts(t)
	b.startController(t, bins.Tiergate, token, dir)
	cs, err := b.kc.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	b.pool = watchPool(t, cs, ns, "llm")
	b.kubectl.MustInput(t, b.manifests(t, adminPort), "apply", "--server-side", "-n", ns, "-f", "-")
	b.kubectl.Must(t, "apply", "-n", ns, "-k", filepath.Join(b.root, "config", "dispatcher"))
	b.kubectl.Must(t, "scale", "-n", ns, "deployment/tiergate-dispatcher", "--replicas="+strconv.Itoa(b.cfg.Dispatchers))
	b.startDispatchers(t, bins.Tiergate, token, adminPort, dataPort)
}

// dispatcherPorts are two ports free on every address of the pod CIDR
// (a dispatcher pod may get any of them): the pool's admin port and the
// dispatchers' data port.
func (b *bench) dispatcherPorts(t *testing.T) (admin, data int) {
	t.Helper()
	var addrs []string
	p := b.podNet.Prefix()
	for a := p.Addr().Next(); p.Contains(a.Next()); a = a.Next() {
		addrs = append(addrs, a.String())
	}
	ports, err := testutil.FreePorts(addrs[0], 2, addrs[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0], ports[1]
}

// startController runs `tiergate controller` as controllerUser (a
// cluster admin) with its default push settings, and its default client
// limits unless cfg.ControllerQPS says otherwise.
func (b *bench) startController(t *testing.T, bin, token, dir string) {
	t.Helper()
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	user := envtest.User{Name: controllerUser, Groups: []string{"system:masters"}}
	if err := controlplane.WriteKubeconfig(b.env, &user, kubeconfig); err != nil {
		t.Fatal(err)
	}
	probe := testutil.FreeAddr(t, "127.0.0.1")
	b.ctrlMetrics = testutil.FreeAddr(t, "127.0.0.1")
	args := []string{"controller",
		"--kubeconfig", kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address", b.ctrlMetrics,
		"--health-probe-bind-address", probe,
		"--push-token-file", token,
	}
	if q := b.cfg.ControllerQPS; q > 0 {
		args = append(args, "--kube-api-qps", strconv.Itoa(q), "--kube-api-burst", strconv.Itoa(2*q))
	}
	if b.cfg.Profile != "" {
		b.ctrlPprof = testutil.FreeAddr(t, "127.0.0.1")
		args = append(args, "--pprof-bind-address", b.ctrlPprof)
	}
	if b.cfg.ControllerLog != "" {
		args = append(args, "--zap-log-level=debug", "--zap-time-encoding=rfc3339nano")
	}
	cmd := exec.Command(bin, args...)
	b.ctrl = testutil.StartT(t, cmd, testutil.Options{Name: "tiergate controller", Grace: 10 * time.Second, LogBytes: 20000})
	if path := b.cfg.ControllerLog; path != "" {
		t.Cleanup(func() {
			if err := os.WriteFile(path, []byte(b.ctrl.Output()), 0o644); err != nil {
				t.Errorf("writing the controller's log: %v", err)
			}
		})
	}
	testutil.WaitHTTP(t, b.ctrl, "http://"+probe+"/readyz", http.StatusOK, 30*time.Second)
	b.rss = sampleRSS(t, b.ctrl.Pid(), 100*time.Millisecond)
}

// startDispatchers waits for the dispatcher pods to get addresses and
// runs a dispatcher process on each, logging JSON (which ParseApplied
// reads). kwok, not the process, makes the pod Ready.
func (b *bench) startDispatchers(t *testing.T, bin, token string, adminPort, dataPort int) {
	t.Helper()
	var ips []string
	testutil.Eventually(t, 2*time.Minute, "dispatcher pods with addresses", func() error {
		var pods corev1.PodList
		if err := b.k8s.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/name": "tiergate-dispatcher"}); err != nil {
			return err
		}
		ips = ips[:0]
		for _, p := range pods.Items {
			if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				ips = append(ips, p.Status.PodIP)
			}
		}
		if len(ips) != b.cfg.Dispatchers || len(pods.Items) != b.cfg.Dispatchers {
			return fmt.Errorf("%d of %d pods with addresses", len(ips), len(pods.Items))
		}
		return nil
	})
	for i, ip := range ips {
		b.ds = append(b.ds, testutil.StartDispatcher(t, bin, testutil.DispatcherOptions{
			Options:   testutil.Options{Name: fmt.Sprintf("dispatcher %d (%s)", i, ip), Grace: 10 * time.Second, LogBytes: 4000},
			Data:      net.JoinHostPort(ip, strconv.Itoa(dataPort)),
			Admin:     net.JoinHostPort(ip, strconv.Itoa(adminPort)),
			TokenFile: token,
			Args:      []string{"--log-format", "json", "--drain-timeout", "1s"},
		}))
	}
}

// manifests are config/samples' pool and tiers with this cluster's ports,
// cfg.Quotas TenantQuotas spread over the three tiers, and the sample
// model Deployment at cfg.Pods replicas.
func (b *bench) manifests(t *testing.T, adminPort int) string {
	t.Helper()
	model := strconv.Itoa(b.podNet.Port())
	read := func(name string) string {
		s, err := os.ReadFile(filepath.Join(b.root, "config", "samples", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(s)
	}
	pool := read("tiergate_v1alpha1_modelpool.yaml")
	pool = replaceOnce(t, pool, "adminPort: 9090", "adminPort: "+strconv.Itoa(adminPort))
	pool = replaceOnce(t, pool, "port: 8000", "port: "+model)
	deploy := read("apps_v1_deployment_llm.yaml")
	deploy = replaceOnce(t, deploy, "replicas: 6", "replicas: "+strconv.Itoa(b.cfg.Pods))
	deploy = replaceOnce(t, deploy, "--port=8000", "--port="+model)
	deploy = replaceOnce(t, deploy, "containerPort: 8000", "containerPort: "+model)
	docs := []string{read("tiergate_v1alpha1_servicetier.yaml"), pool, deploy}
	tiers := []string{"premium", "standard", "free"}
	for i := range b.cfg.Quotas {
		docs = append(docs, fmt.Sprintf("apiVersion: tiergate.dev/v1alpha1\nkind: TenantQuota\nmetadata:\n  name: tenant-%03d\nspec:\n  tenant: tenant-%03d\n  tierRef:\n    name: %s\n",
			i, i, tiers[i%len(tiers)]))
	}
	return strings.Join(docs, "\n---\n")
}

func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if strings.Count(s, old) != 1 {
		t.Fatalf("sample does not contain %q exactly once", old)
	}
	return strings.Replace(s, old, new, 1)
}

// randomPodCIDR is a /21 (2,046 addresses) at a random place of
// 127.90.0.0/16, away from the suites' 127.88.N.0/24.
func randomPodCIDR() string { return fmt.Sprintf("127.90.%d.0/21", 8*rand.IntN(32)) }
