package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/api/v1alpha1"
	clusterutil "github.com/tiergate/tiergate/internal/testutil/cluster"
)

// cluster is the local API server: a real etcd and kube-apiserver from
// bin/k8s (started by envtest), bin/k8s/kubectl, and a client for reading
// what the controllers wrote. The rest of the control plane is kwok.go's.
type cluster struct {
	env        *envtest.Environment
	cfg        *rest.Config
	kubeconfig string
	kubectlBin string
	c          client.Client
}

// startCluster starts etcd and kube-apiserver with their data and logs in
// work, and records their PIDs with sup.
func startCluster(k8sBin, work string, sup *supervisor) (*cluster, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	etcdLog, err := os.Create(filepath.Join(work, "logs", "etcd.log"))
	if err != nil {
		return nil, err
	}
	apiLog, err := os.Create(filepath.Join(work, "logs", "kube-apiserver.log"))
	if err != nil {
		etcdLog.Close()
		return nil, err
	}
	env := &envtest.Environment{
		Scheme:                   scheme,
		BinaryAssetsDirectory:    k8sBin,
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  15 * time.Second,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{
		Path: filepath.Join(k8sBin, "etcd"), DataDir: filepath.Join(work, "etcd"), Out: etcdLog, Err: etcdLog,
	}
	env.ControlPlane.APIServer = &envtest.APIServer{
		Path: filepath.Join(k8sBin, "kube-apiserver"), CertDir: filepath.Join(work, "apiserver"), Out: apiLog, Err: apiLog,
	}
	// The ServiceAccount admission envtest turns off, as the controller
	// manager runs the controllers it needs.
	for _, o := range clusterutil.APIServerOptions() {
		o(env)
	}
	for _, d := range []string{env.ControlPlane.Etcd.DataDir, env.ControlPlane.APIServer.CertDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	cfg, err := env.Start()
	// Record what runs even when Start failed half-way, so it is swept.
	for _, pid := range pidsMentioning(env.ControlPlane.Etcd.DataDir) {
		sup.adopt("etcd", pid)
	}
	for _, pid := range pidsMentioning(env.ControlPlane.APIServer.CertDir) {
		sup.adopt("kube-apiserver", pid)
	}
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("starting etcd and kube-apiserver from %s: %w (logs in %s)", k8sBin, err, filepath.Join(work, "logs"))
	}
	k := &cluster{env: env, cfg: cfg, kubeconfig: filepath.Join(work, "kubeconfig"), kubectlBin: filepath.Join(k8sBin, "kubectl")}
	if err := os.WriteFile(k.kubeconfig, env.KubeConfig, 0o600); err != nil {
		_ = env.Stop()
		return nil, err
	}
	if k.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return k, nil
}

// checkK8sBin makes sure the control-plane binaries and kwok's Stage CRD
// are there.
func checkK8sBin(k8sBin, root string) error {
	for _, name := range []string{"etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler", "kwok"} {
		p := filepath.Join(k8sBin, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable: run `make tools` first", p)
		}
	}
	if fi, err := os.Stat(stageCRD(root)); err != nil || fi.IsDir() {
		return fmt.Errorf("kwok's Stage CRD %s is missing: run `make tools` first", stageCRD(root))
	}
	return nil
}

// stop stops kube-apiserver and etcd (SIGTERM, SIGKILL after the stop
// timeout).
func (k *cluster) stop() error { return k.env.Stop() }

// kubectl runs bin/k8s/kubectl with the demo's kubeconfig and returns its
// combined output.
func (k *cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.kubectlBin, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.SysProcAttr = childAttr()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	s := strings.TrimSpace(out.String())
	if err != nil {
		return s, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, s)
	}
	return s, nil
}

// poolInfo is what the demo needs to know about the applied ModelPool.
type poolInfo struct {
	Namespace, Name  string
	Deployment       string
	ModelLabels      map[string]string // the Deployment's selector
	DispatcherLabels map[string]string
	ModelPort        int
	AdminPort        int
	PerReplica       int
	Replicas         int32         // the Deployment's spec.replicas
	PreStop          time.Duration // the model pods' preStop sleep
	GracePeriod      time.Duration // their terminationGracePeriodSeconds
	TenantHeader     string
	ClientTimeout    time.Duration
	ServiceTime      time.Duration
	Tenants          map[string]string // tenant → tier, from the TenantQuotas
}

func (k *cluster) readPool(ctx context.Context, ns, name string) (*poolInfo, error) {
	var pool v1alpha1.ModelPool
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pool); err != nil {
		return nil, fmt.Errorf("reading ModelPool %s/%s: %w", ns, name, err)
	}
	if pool.Spec.Authentication.Mode != "" && pool.Spec.Authentication.Mode != v1alpha1.AuthTrustedHeader {
		return nil, fmt.Errorf("the demo drives ModelPool %s/%s with a tenant header, but its authentication mode is %s", ns, name, pool.Spec.Authentication.Mode)
	}
	var dep appsv1.Deployment
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: pool.Spec.DeploymentRef.Name}, &dep); err != nil {
		return nil, fmt.Errorf("reading the pool's Deployment: %w", err)
	}
	if dep.Spec.Selector == nil || len(dep.Spec.Selector.MatchLabels) == 0 || len(pool.Spec.Dispatchers.Selector.MatchLabels) == 0 {
		return nil, errors.New("the demo needs matchLabels selectors on the Deployment and on spec.dispatchers")
	}
	p := &poolInfo{
		Namespace: ns, Name: name, Deployment: dep.Name,
		ModelLabels: dep.Spec.Selector.MatchLabels, DispatcherLabels: pool.Spec.Dispatchers.Selector.MatchLabels,
		ModelPort: int(pool.Spec.Backend.Port), AdminPort: int(pool.Spec.Dispatchers.AdminPort),
		PerReplica: int(pool.Spec.ConcurrencyPerReplica), Replicas: 1,
		TenantHeader: pool.Spec.Authentication.HeaderName, ServiceTime: pool.Spec.ServiceTime.Mean.Duration,
		Tenants: map[string]string{},
	}
	if dep.Spec.Replicas != nil {
		p.Replicas = *dep.Spec.Replicas
	}
	p.PreStop = clusterutil.PreStopSleep(&corev1.Pod{Spec: dep.Spec.Template.Spec})
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		p.GracePeriod = time.Duration(*g) * time.Second
	}
	if p.TenantHeader == "" {
		p.TenantHeader = "X-Tenant-ID"
	}
	if p.AdminPort == 0 {
		p.AdminPort = 9090
	}
	if pool.Spec.ClientTimeout != nil {
		p.ClientTimeout = pool.Spec.ClientTimeout.Duration
	}
	var quotas v1alpha1.TenantQuotaList
	if err := k.c.List(ctx, &quotas, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for _, q := range quotas.Items {
		p.Tenants[q.Spec.Tenant] = q.Spec.TierRef.Name
	}
	if pool.Spec.DefaultTier != "" {
		p.Tenants[""] = pool.Spec.DefaultTier
	}
	return p, nil
}

// tierOf is the tier the pool puts tenant in.
func (p *poolInfo) tierOf(tenant string) string {
	if t, ok := p.Tenants[tenant]; ok {
		return t
	}
	return p.Tenants[""]
}

// finalState is what the report shows of the cluster at the end.
type finalState struct {
	Conditions []metav1.Condition
	Tiers      []v1alpha1.ServiceTier
	Events     []string
	Get        string // kubectl get modelpools,servicetiers,tenantquotas
}

func (k *cluster) final(ctx context.Context, p *poolInfo) (*finalState, error) {
	fs := &finalState{}
	var pool v1alpha1.ModelPool
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, &pool); err != nil {
		return nil, err
	}
	fs.Conditions = pool.Status.Conditions
	var tiers v1alpha1.ServiceTierList
	if err := k.c.List(ctx, &tiers, client.InNamespace(p.Namespace)); err != nil {
		return nil, err
	}
	fs.Tiers = tiers.Items
	var events corev1.EventList
	if err := k.c.List(ctx, &events, client.InNamespace(p.Namespace)); err != nil {
		return nil, err
	}
	sort.Slice(events.Items, func(i, j int) bool {
		return eventTime(&events.Items[i]).Before(eventTime(&events.Items[j]))
	})
	for _, e := range events.Items {
		if e.InvolvedObject.Kind != "ModelPool" && e.InvolvedObject.Kind != "ServiceTier" && e.InvolvedObject.Kind != "TenantQuota" {
			continue
		}
		n := e.Count
		if e.Series != nil {
			n = e.Series.Count
		}
		fs.Events = append(fs.Events, fmt.Sprintf("%s %s/%s %s: %s (×%d)", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, max(n, 1)))
	}
	out, err := k.kubectl(ctx, "-n", p.Namespace, "get", "modelpools,servicetiers,tenantquotas")
	if err != nil {
		return nil, err
	}
	fs.Get = out
	return fs, nil
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}
