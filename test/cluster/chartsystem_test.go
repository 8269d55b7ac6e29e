package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// chartPorts are the ports the chart's values give its containers, free
// on every address of the pod CIDR (a chart pod may get any of them).
type chartPorts struct{ data, admin, metrics, health int }

func newChartPorts(t *testing.T) chartPorts {
	t.Helper()
	var others []string
	for i := 2; i < 255; i++ {
		others = append(others, podAddr(i))
	}
	p, err := testutil.FreePorts(podAddr(1), 4, others...)
	if err != nil {
		t.Fatal(err)
	}
	return chartPorts{data: p[0], admin: p[1], metrics: p[2], health: p[3]}
}

// leaseName is the controller's leader election Lease (its
// --leader-election-id default; the chart passes none).
const leaseName = "tiergate-controller.tiergate.dev"

// chartSystem is the release's pods run as processes.
type chartSystem struct {
	ctl   *podProcess
	disp  []*podProcess
	ds    []*testutil.Dispatcher
	token string
}

// runChartSystem runs the controller's pod and then each dispatcher pod
// as processes (startPodProcess), applies config/samples' pool (whose
// dispatcher selector is the chart's dispatcher label) in ns and checks
// the installed system: the controller runs as its ServiceAccount, leads
// through the release's Lease and pushes the pool's policy to every chart
// dispatcher; each answers a completion; the pool is Ready; every probe
// the Pods declare answers 200.
func runChartSystem(t *testing.T, ns, release, full string, ports chartPorts) *chartSystem {
	t.Helper()
	sel := map[string]string{"app.kubernetes.io/instance": release}
	ctlPod := livePods(t, ns, sel, "tiergate-controller", 1)[0]
	run := startStep(t)
	s := &chartSystem{ctl: startPodProcess(t, &ctlPod)}
	awaitProbe(t, s.ctl, s.ctl.pod.Spec.Containers[0].ReadinessProbe)
	run.done("controller process on its pod IP as its ServiceAccount, /readyz")
	checkControllerIdentity(t, s.ctl, full+"-controller")
	checkLeader(t, ns, s.ctl)
	run.done("controller holds the release's Lease")
	s.token = awaitPushToken(t, ns, full+"-push-token")
	s.ctl.resync(t) // the kubelet fills the controller's optional token volume
	run.done("controller created the push token Secret")

	for _, p := range livePods(t, ns, sel, "tiergate-dispatcher", 2) {
		pp := startPodProcess(t, &p)
		awaitProbe(t, pp, p.Spec.Containers[0].LivenessProbe)
		s.disp = append(s.disp, pp)
		s.ds = append(s.ds, &testutil.Dispatcher{Process: pp.proc, Token: s.token,
			Data:  net.JoinHostPort(p.Status.PodIP, strconv.Itoa(ports.data)),
			Admin: net.JoinHostPort(p.Status.PodIP, strconv.Itoa(ports.admin))})
	}
	run.done("2 dispatcher processes on their pod IPs, /healthz")

	w := watchPolicies(t, s.ds)
	kubectl.MustInput(t, samples(t, ports.admin), "apply", "-n", ns, "-f", "-")
	awaitFollow(t, ns, w, 6, 30*time.Second)
	w.stop()
	run.done("pool applied: both dispatchers hold the 6 Ready model pods")
	checkPoolPushed(t, ns, s.ds)
	run.done("ModelPool Ready, both dispatchers synced")
	for _, pp := range append([]*podProcess{s.ctl}, s.disp...) {
		c := pp.pod.Spec.Containers[0]
		checkProbe(t, pp, "readiness", c.ReadinessProbe)
		checkProbe(t, pp, "liveness", c.LivenessProbe)
	}
	checkAnsweredThrough(t, s.ds)
	run.done("probes 200; a completion answered through each dispatcher")
	return s
}

// stop ends the processes as the kubelet would (SIGTERM, exit 0): the
// controller first, so it pushes to no stopped dispatcher. The controller
// logged no error about ns while it ran and nothing forbidden at all, and
// it released the Lease.
func (s *chartSystem) stop(t *testing.T, ns string) {
	t.Helper()
	running := s.ctl.proc.Output()
	s.ctl.stop(t)
	for _, pp := range s.disp {
		pp.stop(t)
	}
	checkControllerQuiet(t, ns, running)
	out := s.ctl.proc.Output()
	checkShutdownLog(t, ns, out[len(running):])
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "forbidden") {
			t.Errorf("the controller was refused by the chart's RBAC: %s", line)
		}
	}
	var l coordinationv1.Lease
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: leaseName}, &l); err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "" {
		t.Errorf("Lease %s after the controller stopped: holder %v, want released (\"\")", leaseName, deref(h))
	}
}

// shutdownError is what controller-runtime's manager logs, at error level
// with a stack trace, when it releases its Lease on a clean SIGTERM (the
// release reads as "leader election lost" to its own callback). The exit
// status is still 0; it is logged here as a finding, and any other error
// while stopping fails the test.
const shutdownError = `"msg":"error received after stop sequence was engaged","error":"leader election lost"`

func checkShutdownLog(t *testing.T, ns, out string) {
	t.Helper()
	lines, _ := controllerErrors(out, ns)
	for _, line := range lines {
		if strings.Contains(line, shutdownError) {
			t.Logf("finding: a clean SIGTERM with leader election logs at error level: %s", line[:min(len(line), 160)])
			continue
		}
		t.Errorf("the controller logged an error while stopping: %s", line)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// livePods waits for n pods of the release's component name that have an
// IP and are not terminating (an evicted pod may still be).
func livePods(t *testing.T, ns string, sel map[string]string, name string, n int) []corev1.Pod {
	t.Helper()
	var live []corev1.Pod
	await(t, 20*time.Second, fmt.Sprintf("%d live %s pods with IPs", n, name), func() (bool, string) {
		all := chartPods(t, ns, sel, name)
		live = slices.DeleteFunc(all, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil || p.Status.PodIP == "" })
		return len(live) == n, describePods(live)
	})
	return live
}

// awaitProbe waits for the container's probe to answer 200 from its
// process, failing at once if the process exits.
func awaitProbe(t *testing.T, pp *podProcess, p *corev1.Probe) {
	t.Helper()
	await(t, 30*time.Second, pp.name+" probe "+p.HTTPGet.Path, func() (bool, string) {
		if pp.proc.Exited() {
			t.Fatalf("%s exited: %v\n%s", pp.name, pp.proc.Err(), testutil.LastBytes(pp.proc.Output(), 4000))
		}
		code, err := probeGet(&pp.pod, p)
		return err == nil && code == 200, fmt.Sprintf("%d %v", code, err)
	})
}

func checkProbe(t *testing.T, pp *podProcess, kind string, p *corev1.Probe) {
	t.Helper()
	if code, err := probeGet(&pp.pod, p); err != nil || code != 200 {
		t.Errorf("%s: %s probe %s: %d %v, want 200", pp.name, kind, p.HTTPGet.Path, code, err)
	}
}

// checkControllerIdentity: the token the controller's volume holds
// authenticates as the pod's ServiceAccount, bound to the pod, and RBAC
// (not the admin) decides what it may do: the chart grants no delete of
// a Deployment, and the API server refuses it with 403 Forbidden.
func checkControllerIdentity(t *testing.T, pp *podProcess, sa string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigArg(t, pp))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, ns := context.Background(), pp.pod.Namespace
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + ns + ":" + sa
	got := []string{r.Status.UserInfo.Username, strings.Join(r.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"], ",")}
	if diff := cmp.Diff([]string{user, pp.pod.Name}, got); diff != "" {
		t.Errorf("the controller's token authenticates as (-want +got):\n%s", diff)
	}
	err = cs.AppsV1().Deployments(ns).Delete(ctx, "llm", metav1.DeleteOptions{})
	var status apierrors.APIStatus
	if !apierrors.IsForbidden(err) || !errors.As(err, &status) {
		t.Fatalf("deleting a Deployment as the controller: %v, want 403 Forbidden", err)
	}
	want := fmt.Sprintf(`deployments.apps "llm" is forbidden: User %q cannot delete resource "deployments" in API group "apps" in the namespace %q`, user, ns)
	if got := status.Status().Message; got != want {
		t.Errorf("refusal %q, want %q", got, want)
	}
}

// kubeconfigArg is the --kubeconfig the pod's process was given.
func kubeconfigArg(t *testing.T, pp *podProcess) string {
	t.Helper()
	for _, a := range pp.args {
		if v, ok := strings.CutPrefix(a, "--kubeconfig="); ok {
			return v
		}
	}
	t.Fatalf("%s has no --kubeconfig: its pod mounts no ServiceAccount token", pp.name)
	return ""
}

// checkLeader waits for the controller to hold the Lease the chart's
// Role lets it write, in the release namespace (--leader-election-namespace):
// client-go's identity is the host name and a random suffix.
func checkLeader(t *testing.T, ns string, pp *podProcess) {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	await(t, 20*time.Second, "the controller leading", func() (bool, string) {
		var l coordinationv1.Lease
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: leaseName}, &l); err != nil {
			return false, err.Error()
		}
		h := deref(l.Spec.HolderIdentity)
		return strings.HasPrefix(h, host+"_"), "holder " + h
	})
	pp.proc.WaitOutput(t, 10*time.Second, "the lease acquired", func(out string) bool {
		return strings.Contains(out, `"msg":"Successfully acquired lease","lock":"`+ns+"/"+leaseName+`"`)
	})
}

// awaitPushToken waits for the Secret the controller creates
// (--push-token-secret) and returns its token: 48 characters.
func awaitPushToken(t *testing.T, ns, name string) string {
	t.Helper()
	var token string
	await(t, 20*time.Second, "the push token Secret", func() (bool, string) {
		var s corev1.Secret
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			return false, err.Error()
		}
		token = string(s.Data["token"])
		return true, ""
	})
	if len(token) != 48 {
		t.Errorf("push token of %d characters, want 48", len(token))
	}
	return token
}

// checkPoolPushed: the ModelPool is Ready, counts both chart dispatchers
// Ready and synced to its policy version, which both hold.
func checkPoolPushed(t *testing.T, ns string, ds []*testutil.Dispatcher) {
	t.Helper()
	await(t, 20*time.Second, "the pool Ready with 2 synced dispatchers", func() (bool, string) {
		var mp v1alpha1.ModelPool
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "llm"}, &mp); err != nil {
			return false, err.Error()
		}
		var versions []int64
		for _, d := range ds {
			p, err := appliedPolicy(d)
			if err != nil {
				return false, err.Error()
			}
			versions = append(versions, p.Version)
		}
		want := v1alpha1.DispatcherCounts{Total: 2, Ready: 2, Synced: 2}
		ok := readyCondition(&mp) == "True/PoolReady" && mp.Status.Dispatchers == want &&
			versions[0] == mp.Status.PolicyVersion && versions[1] == mp.Status.PolicyVersion
		return ok, fmt.Sprintf("Ready %s, dispatchers %+v, policy v%d; dispatchers hold %v", readyCondition(&mp), mp.Status.Dispatchers, mp.Status.PolicyVersion, versions)
	})
	for i, d := range ds {
		p, err := appliedPolicy(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("dispatcher %d (%s): %d policies applied, holds %s", i, d.Admin, len(applies(t, d)), describePolicy(p))
	}
}

// checkAnsweredThrough sends a completion with openai-go to each
// dispatcher pod's data port, as the premium tenant: answered 200 by
// simserver behind a model pod's address.
func checkAnsweredThrough(t *testing.T, ds []*testutil.Dispatcher) {
	t.Helper()
	before := simStats(t)
	for _, d := range ds {
		c := openai.NewClient(option.WithBaseURL("http://"+d.Data+"/v1"), option.WithAPIKey("unused"),
			option.WithHeader("X-Tenant-ID", "acme"), option.WithMaxRetries(0), option.WithRequestTimeout(10*time.Second))
		resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
			Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
		})
		if err != nil {
			t.Errorf("completion through dispatcher %s: %v", d.Data, err)
			continue
		}
		if len(resp.Choices) != 1 || resp.Model != "sim-model" {
			t.Errorf("completion through dispatcher %s: %+v", d.Data, resp)
		}
	}
	if got, want := simStats(t).Completed-before.Completed, int64(len(ds)); got != want {
		t.Errorf("simserver completed %d requests, want %d", got, want)
	}
}
