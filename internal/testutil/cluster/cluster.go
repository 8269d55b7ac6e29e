package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

// DefaultControllers are the kube-controller-manager controllers a
// Cluster runs: what a Deployment needs to become Ready pods and an
// EndpointSlice, what a namespace needs to hold pods (its default
// ServiceAccount, whose admission the API server must then run: see
// APIServerOptions) and to be deleted, what deletes a Deployment's
// ReplicaSets and pods with it, what keeps a PodDisruptionBudget's status,
// and the node-lifecycle controller, which takes the not-ready taint the
// API server puts on every new Node off once kwok has made it Ready (and
// watches the Leases kwok renews). No taint-eviction controller runs, so a
// Node that went silent would keep its pods.
var DefaultControllers = []string{
	"node-lifecycle-controller",
	"deployment-controller",
	"replicaset-controller",
	"endpointslice-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"disruption-controller",
	"pod-garbage-collector-controller",
}

// NodeAnnotation marks the Nodes kwok manages (kwok's
// --manage-nodes-with-annotation-selector).
const NodeAnnotation = "kwok.x-k8s.io/node"

// Options say what Start starts.
type Options struct {
	// Assets is the directory of kube-controller-manager, kube-scheduler
	// and kwok (controlplane.Assets: KUBEBUILDER_ASSETS or bin/k8s).
	Assets string
	// StageCRD is kwok's Stage CRD (bin/kwok/kwok.x-k8s.io_stages.yaml).
	StageCRD string
	// Dir holds the kubeconfig, the configuration files and each
	// component's log (NAME.log); Start makes it, the caller removes it.
	Dir string
	// Nodes is how many fake Nodes to create; the default is 1.
	Nodes int
	// PodCIDR is kwok's --cidr, inside 127.0.0.0/8; the default is a
	// random 127.88.N.0/24. kwok hands out its addresses in order without
	// checking the end of the range, so it must hold as many addresses as
	// pods exist at once.
	PodCIDR string
	// Stages are the pod lifecycle's delays; zero values mean 1s each.
	Stages StageOptions
	// Controllers replaces DefaultControllers.
	Controllers []string
	// Verbosity is kube-controller-manager's and kube-scheduler's -v.
	Verbosity int
	// StopGrace is how long Stop waits after SIGTERM; the default is 5s.
	StopGrace time.Duration
}

// Cluster is kube-controller-manager, kube-scheduler and kwok running
// against an envtest API server, with fake Nodes.
type Cluster struct {
	// Kubeconfig is the admin kubeconfig the components use.
	Kubeconfig string
	// PodCIDR is the CIDR kwok gives pod IPs from.
	PodCIDR string
	// Nodes are the fake Nodes' names.
	Nodes []string

	ControllerManager, Scheduler, Kwok *Component

	opts     Options
	cfg      *rest.Config
	client   client.Client
	networks []*followedNetwork
}

// APIServerOptions are what the API server of a Cluster must run with:
// the ServiceAccount admission plugin, which envtest turns off because it
// runs no serviceaccount controller. A Cluster runs one, so pods get their
// namespace's default ServiceAccount as on a real cluster.
func APIServerOptions() []controlplane.Option {
	return []controlplane.Option{controlplane.WithoutAPIServerFlag("disable-admission-plugins")}
}

// Start installs kwok's Stage CRD and the Stages on env's API server, starts
// kube-controller-manager, kube-scheduler and kwok, waits until the first
// two answer /healthz, then creates o.Nodes Nodes and waits until kwok
// has made them Ready. On an error it stops what it started.
func Start(ctx context.Context, env *envtest.Environment, cfg *rest.Config, o Options) (*Cluster, error) {
	o, err := withDefaults(o)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, cfg: cfg, PodCIDR: o.PodCIDR}
	if err := c.start(ctx, env); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func withDefaults(o Options) (Options, error) {
	if o.Dir == "" {
		return o, errors.New("cluster: Options.Dir is required")
	}
	for _, name := range []string{"kube-controller-manager", "kube-scheduler", "kwok"} {
		p := filepath.Join(o.Assets, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return o, fmt.Errorf("cluster binary %s is missing or not executable; run `make tools` first", p)
		}
	}
	if fi, err := os.Stat(o.StageCRD); err != nil || fi.IsDir() {
		return o, fmt.Errorf("kwok's Stage CRD %q is missing; run `make tools` first", o.StageCRD)
	}
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes < 0 {
		return o, fmt.Errorf("cluster: %d nodes", o.Nodes)
	}
	if o.PodCIDR == "" {
		o.PodCIDR = fmt.Sprintf("127.88.%d.0/24", 1+rand.IntN(254))
	}
	if o.Stages.ColdStart == 0 {
		o.Stages.ColdStart = time.Second
	}
	if o.Stages.TerminationDelay == 0 {
		o.Stages.TerminationDelay = time.Second
	}
	if o.Stages.CrashDetection == 0 {
		o.Stages.CrashDetection = time.Second
	}
	if len(o.Controllers) == 0 {
		o.Controllers = DefaultControllers
	}
	if o.StopGrace == 0 {
		o.StopGrace = 5 * time.Second
	}
	return o, nil
}

func (c *Cluster) start(ctx context.Context, env *envtest.Environment) error {
	o := c.opts
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(o.Dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(env, nil, c.Kubeconfig); err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	var err error
	if c.client, err = client.New(c.cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	if _, err := envtest.InstallCRDs(c.cfg, envtest.CRDInstallOptions{Paths: []string{o.StageCRD}, ErrorIfPathMissing: true}); err != nil {
		return fmt.Errorf("installing kwok's Stage CRD: %w", err)
	}
	if err := ApplyStages(ctx, c.client, o.Stages); err != nil {
		return err
	}
	if err := c.startControllerManager(env); err != nil {
		return err
	}
	if err := c.startScheduler(); err != nil {
		return err
	}
	if err := c.startKwok(); err != nil {
		return err
	}
	for _, comp := range []*Component{c.ControllerManager, c.Scheduler} {
		if err := waitHealthy(ctx, comp, 60*time.Second); err != nil {
			return err
		}
	}
	return c.createNodes(ctx)
}

// ApplyStages applies the Stages again with other delays (for the pods
// that reach a Stage from now on).
func (c *Cluster) ApplyStages(ctx context.Context, o StageOptions) error {
	return ApplyStages(ctx, c.client, o)
}

// Clientset is a client-go clientset of the API server.
func (c *Cluster) Clientset() (kubernetes.Interface, error) { return kubernetes.NewForConfig(c.cfg) }

// Stop stops the networks, kwok, kube-scheduler and kube-controller-
// manager (SIGTERM to each process group, SIGKILL after StopGrace). The
// error names a component that had exited by itself or would not stop.
// Idempotent.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.networks {
		errs = append(errs, n.close())
	}
	c.networks = nil
	for _, comp := range []*Component{c.Kwok, c.Scheduler, c.ControllerManager} {
		if comp != nil {
			errs = append(errs, comp.Stop(c.opts.StopGrace))
		}
	}
	return errors.Join(errs...)
}

// Components are the processes started so far.
func (c *Cluster) Components() []*Component {
	var out []*Component
	for _, comp := range []*Component{c.ControllerManager, c.Scheduler, c.Kwok} {
		if comp != nil {
			out = append(out, comp)
		}
	}
	return out
}

// Logs is the last n lines of every component's log, for a failed test.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	for _, comp := range c.Components() {
		fmt.Fprintf(&b, "--- %s (%s) ---\n%s\n", comp.Name, comp.Log, comp.Tail(n))
	}
	return b.String()
}

// podIsReady reports whether p's Ready condition is True.
func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
