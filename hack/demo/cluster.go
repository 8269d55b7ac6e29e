package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// cluster is the local control plane: a real etcd and kube-apiserver from
// bin/k8s (started by envtest), bin/k8s/kubectl, and a client for what the
// kubelet and the autoscaler would write.
type cluster struct {
	env        *envtest.Environment
	kubeconfig string
	kubectlBin string
	c          client.Client
}

// startCluster starts etcd and kube-apiserver with their data and logs in
// work, and records their PIDs with sup.
func startCluster(k8sBin, work string, sup *supervisor) (*cluster, error) {
	if err := checkK8sBin(k8sBin); err != nil {
		return nil, err
	}
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
	k := &cluster{env: env, kubeconfig: filepath.Join(work, "kubeconfig"), kubectlBin: filepath.Join(k8sBin, "kubectl")}
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

// checkK8sBin makes sure the control-plane binaries are there.
func checkK8sBin(k8sBin string) error {
	for _, name := range []string{"etcd", "kube-apiserver", "kubectl"} {
		p := filepath.Join(k8sBin, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable: run `make tools` first", p)
		}
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
	Replicas         int32 // the Deployment's spec.replicas
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

// createPod creates a Pod and sets its status as a kubelet would once the
// container runs: Running, the IP, not Ready yet.
func (k *cluster) createPod(ctx context.Context, ns, name string, labels map[string]string, ip string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Image: "local.invalid/" + name, Command: []string{"(a local process of the demo)"},
		}}},
	}
	if err := k.c.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating pod %s: %w", name, err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: "127.0.0.1", StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: now}},
	}
	if err := k.c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("setting the status of pod %s: %w", name, err)
	}
	return nil
}

// setPodReady writes the pod's Ready condition.
func (k *cluster) setPodReady(ctx context.Context, ns, name string, ready bool) error {
	want := corev1.ConditionFalse
	if ready {
		want = corev1.ConditionTrue
	}
	for attempt := 0; ; attempt++ {
		var pod corev1.Pod
		if err := k.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
			return err
		}
		found := false
		for i := range pod.Status.Conditions {
			if c := &pod.Status.Conditions[i]; c.Type == corev1.PodReady {
				found = true
				if c.Status == want {
					return nil
				}
				c.Status, c.LastTransitionTime = want, metav1.Now()
			}
		}
		if !found {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: want, LastTransitionTime: metav1.Now()})
		}
		err := k.c.Status().Update(ctx, &pod)
		if err == nil || !apierrors.IsConflict(err) || attempt == 5 {
			return err
		}
	}
}

// patchReadyReplicas plays the autoscaler and the Deployment controller:
// it patches the Deployment's status with kubectl. It returns the command.
func (k *cluster) patchReadyReplicas(ctx context.Context, p *poolInfo, ready int32) (string, error) {
	patch := fmt.Sprintf(`{"status":{"replicas":%d,"updatedReplicas":%d,"readyReplicas":%d,"availableReplicas":%d}}`,
		p.Replicas, p.Replicas, ready, ready)
	args := []string{"-n", p.Namespace, "patch", "deployment", p.Deployment, "--subresource=status", "--type=merge", "-p", patch}
	_, err := k.kubectl(ctx, args...)
	return "kubectl " + strings.Join(args[:len(args)-1], " ") + " '" + patch + "'", err
}

// kubelet plays the kubelet's readiness probes: every pod it knows is Ready
// when its probe answers 200 and the demo wants it Ready (the model pods
// the scale-down takes away are NotReady, like terminating pods).
type kubelet struct {
	k      *cluster
	ns     string
	client *http.Client

	mu   sync.Mutex
	pods map[string]*kpod
	errs int
	last error
}

type kpod struct {
	probe   string // URL that must answer 200
	want    bool
	written *bool // the Ready condition last written
}

func newKubelet(k *cluster, ns string) *kubelet {
	return &kubelet{k: k, ns: ns, pods: map[string]*kpod{}, client: &http.Client{Timeout: 700 * time.Millisecond}}
}

func (kl *kubelet) add(name, probe string) {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	kl.pods[name] = &kpod{probe: probe, want: true}
}

// setWant marks pods as wanted Ready or not; sync applies it.
func (kl *kubelet) setWant(names []string, want bool) {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	for _, n := range names {
		if p, ok := kl.pods[n]; ok {
			p.want = want
		}
	}
}

// sync probes every pod once and writes the Ready conditions that changed.
func (kl *kubelet) sync(ctx context.Context) error {
	kl.mu.Lock()
	names := make([]string, 0, len(kl.pods))
	for n := range kl.pods {
		names = append(names, n)
	}
	kl.mu.Unlock()
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		kl.mu.Lock()
		p := kl.pods[n]
		probe, want, written := p.probe, p.want, p.written
		kl.mu.Unlock()
		ready := want && kl.probe(ctx, probe)
		if written != nil && *written == ready {
			continue
		}
		if err := kl.k.setPodReady(ctx, kl.ns, n, ready); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", n, err))
			continue
		}
		kl.mu.Lock()
		p.written = &ready
		kl.mu.Unlock()
	}
	err := errors.Join(errs...)
	if err != nil {
		kl.mu.Lock()
		kl.errs++
		kl.last = err
		kl.mu.Unlock()
	}
	return err
}

func (kl *kubelet) probe(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := kl.client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// run syncs every half second until ctx ends.
func (kl *kubelet) run(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = kl.sync(ctx)
		}
	}
}

// failures is how many sync passes failed, and the last error.
func (kl *kubelet) failures() (int, error) {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	return kl.errs, kl.last
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
