package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
)

func TestStartRefusals(t *testing.T) {
	empty := t.TempDir()
	tests := map[string]struct {
		opts Options
		want string
	}{
		"no directory": {Options{Assets: empty}, "cluster: Options.Dir is required"},
		"no binaries": {Options{Assets: empty, Dir: empty},
			"cluster binary " + filepath.Join(empty, "kube-controller-manager") + " is missing or not executable; run `make tools` first"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Start(context.Background(), nil, nil, tc.opts)
			if err == nil || err.Error() != tc.want {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCluster starts the real components against a real API server, plays
// one pod through every Stage with its address in a Network, and stops.
func TestCluster(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := controlplane.Assets(root)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	env, cfg, err := controlplane.Start(root, assets, scheme, APIServerOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	ctx := context.Background()
	start := time.Now()
	c, err := Start(ctx, env, cfg, Options{
		Assets:   assets,
		StageCRD: filepath.Join(root, "bin", "kwok", "kwok.x-k8s.io_stages.yaml"),
		Dir:      t.TempDir(),
		Nodes:    2,
		Stages:   StageOptions{ColdStart: 700 * time.Millisecond, TerminationDelay: 600 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-controller-manager, kube-scheduler and kwok up with 2 Ready Nodes in %s (pod CIDR %s)", time.Since(start).Round(time.Millisecond), c.PodCIDR)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
		if t.Failed() {
			t.Log(c.Logs(40))
		}
	})
	if diff := cmp.Diff([]string{"kwok-node-0", "kwok-node-1"}, c.Nodes); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	checkLoopbackOnly(t, c)
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("namespace gets its default ServiceAccount", func(t *testing.T) { checkDefaultServiceAccount(t, k8s) })
	t.Run("a pod through every stage", func(t *testing.T) { playPod(t, c, k8s) })

	comps := c.Components()
	if err := c.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	stopped = true
	for _, comp := range comps {
		if !comp.Exited() {
			t.Errorf("%s still runs after Stop", comp.Name)
		}
		if err := syscall.Kill(-comp.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s's process group after Stop: %v, want ESRCH", comp.Name, err)
		}
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}

	// A second Cluster on the same API server (as suites of one package
	// start one each) replaces the Nodes the first left, and plays pods.
	again, err := Start(ctx, env, cfg, Options{Assets: assets, StageCRD: filepath.Join(root, "bin", "kwok", "kwok.x-k8s.io_stages.yaml"),
		Dir: t.TempDir(), Nodes: 2, Stages: StageOptions{ColdStart: 100 * time.Millisecond}})
	if err != nil {
		t.Fatalf("a second cluster on the same API server: %v", err)
	}
	defer func() {
		_ = again.Stop()
		if t.Failed() {
			t.Log(again.Logs(40))
		}
	}()
	if diff := cmp.Diff([]string{"kwok-node-0", "kwok-node-1"}, again.Nodes); diff != "" {
		t.Errorf("the second cluster's nodes (-want +got):\n%s", diff)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "again"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.invalid/none"}}}}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "a pod Ready on the second cluster", func() error {
		var p corev1.Pod
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return err
		}
		if !podIsReady(&p) || !strings.HasPrefix(p.Spec.NodeName, "kwok-node-") {
			return fmt.Errorf("node %q, conditions %+v", p.Spec.NodeName, p.Status.Conditions)
		}
		return nil
	})
}

// checkLoopbackOnly: kube-controller-manager and kube-scheduler listen on
// 127.0.0.1 only (one port each), kwok on nothing.
func checkLoopbackOnly(t *testing.T, c *Cluster) {
	t.Helper()
	for _, comp := range c.Components() {
		addrs, err := listeningAddrs(comp.Pid())
		if err != nil {
			t.Fatal(err)
		}
		want := 1
		if comp.Name == "kwok" {
			want = 0
		}
		if len(addrs) != want {
			t.Errorf("%s listens on %v, want %d address", comp.Name, addrs, want)
		}
		for _, a := range addrs {
			if !strings.HasPrefix(a, "127.0.0.1:") {
				t.Errorf("%s listens on %s, not on 127.0.0.1", comp.Name, a)
			}
		}
	}
}

func checkDefaultServiceAccount(t *testing.T, k8s client.Client) {
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sa-check"}}); err != nil {
		t.Fatal(err)
	}
	awaitDefaultServiceAccount(t, k8s, "sa-check")
}

// awaitDefaultServiceAccount waits for ns's default ServiceAccount, which
// the ServiceAccount admission plugin wants before it admits a pod.
func awaitDefaultServiceAccount(t *testing.T, k8s client.Client, ns string) {
	t.Helper()
	err := testutil.Poll(10*time.Second, func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "default"}, &corev1.ServiceAccount{})
	})
	if err != nil {
		t.Fatalf("the serviceaccount controller made no default ServiceAccount in %s: %v", ns, err)
	}
}

// playPod creates a pod (the one unit here that means to: the suites make
// theirs through Deployments) and follows it through the Stages: bound by
// the scheduler, started with an address of the pod CIDR, Ready a cold
// start later, failed by the chaos label and back, terminating for the
// termination delay, gone; its address follows in the Network.
func playPod(t *testing.T, c *Cluster, k8s client.Client) {
	ctx := context.Background()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "model") }))
	defer b.Close()
	n, err := c.Network(ctx, 0, b.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	awaitDefaultServiceAccount(t, k8s, "default")
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "model-0",
			Annotations: map[string]string{ColdStartAnnotation: "1500ms"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "model", Image: "model:latest"}}},
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	key := client.ObjectKeyFromObject(p)
	get := func() *corev1.Pod {
		var got corev1.Pod
		if err := k8s.Get(ctx, key, &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	await := func(what string, timeout time.Duration, cond func(*corev1.Pod) bool) time.Duration {
		t.Helper()
		from := time.Now()
		testutil.Eventually(t, timeout, what, func() error {
			if p := get(); !cond(p) {
				return fmt.Errorf("node %q, phase %s, IP %q, conditions %+v", p.Spec.NodeName, p.Status.Phase, p.Status.PodIP, p.Status.Conditions)
			}
			return nil
		})
		return time.Since(from)
	}
	await("the pod started with an address", 10*time.Second, func(p *corev1.Pod) bool { return p.Status.PodIP != "" })
	p = get()
	ip := p.Status.PodIP
	if !n.Contains(ip) || !strings.HasPrefix(p.Spec.NodeName, "kwok-node-") || p.Status.Phase != corev1.PodRunning || podIsReady(p) {
		t.Fatalf("started pod: ip %s (in %s: %t), node %q, phase %s, Ready %t", ip, c.PodCIDR, n.Contains(ip), p.Spec.NodeName, p.Status.Phase, podIsReady(p))
	}
	await("Ready", 10*time.Second, podIsReady)
	// The pod's annotation, not the Stage's 700ms, sets its cold start.
	if d := time.Since(created); d < 1500*time.Millisecond {
		t.Errorf("Ready %s after creation, before its 1.5s cold start", d)
	}
	t.Logf("Ready %s after creation (cold start 1.5s)", time.Since(created).Round(time.Millisecond))
	testutil.EventuallyTrue(t, 5*time.Second, "the address serving", func() bool { return n.State(ip) == Serving })
	if got := httpGet(t, ip, n.Port()); got != "model" {
		t.Errorf("GET through the pod's address: %q", got)
	}

	// Chaos: NotReady, its address closed; without the label, Ready again.
	setLabel(t, k8s, key, ChaosLabel, "true")
	d := await("NotReady after the chaos label", 10*time.Second, func(p *corev1.Pod) bool { return !podIsReady(p) })
	p = get()
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 1 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "CrashLoopBackOff" {
		t.Errorf("failed pod's containers: %+v", cs)
	}
	t.Logf("NotReady %s after the chaos label", d.Round(time.Millisecond))
	testutil.EventuallyTrue(t, 5*time.Second, "the address closed", func() bool { return n.State(ip) == Closed })
	setLabel(t, k8s, key, ChaosLabel, "")
	d = await("Ready again without the label", 10*time.Second, podIsReady)
	t.Logf("Ready again %s after the label went", d.Round(time.Millisecond))

	// A quick restart: the restart count and last state move, the pod
	// stays Ready and serving, and the Stage takes its label away.
	before := get()
	started := before.Status.ContainerStatuses[0].State.Running.StartedAt
	setLabel(t, k8s, key, RestartLabel, "true")
	await("restarted once", 10*time.Second, func(p *corev1.Pod) bool {
		_, labelled := p.Labels[RestartLabel]
		return !labelled && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == before.Status.ContainerStatuses[0].RestartCount+1
	})
	p = get()
	cs := p.Status.ContainerStatuses[0]
	if last := cs.LastTerminationState.Terminated; !podIsReady(p) || cs.State.Running == nil || last == nil || last.ExitCode != 2 ||
		last.Message != "restarted by "+RestartLabel+"=true" || !last.StartedAt.Equal(&started) || last.FinishedAt.IsZero() ||
		cs.Image != before.Status.ContainerStatuses[0].Image {
		t.Errorf("restarted pod: Ready %t, container %+v", podIsReady(p), cs)
	}
	if n.State(ip) != Serving {
		t.Errorf("the restarted pod's address is %v, want serving", n.State(ip))
	}

	// Deletion: terminating (draining) for the termination delay, then gone.
	if err := k8s.Delete(ctx, get()); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	testutil.EventuallyTrue(t, 5*time.Second, "the address draining", func() bool { return n.State(ip) == Draining })
	testutil.Eventually(t, 10*time.Second, "the pod gone", func() error {
		var got corev1.Pod
		if err := k8s.Get(ctx, key, &got); client.IgnoreNotFound(err) != nil || err == nil {
			return errors.Join(errors.New("still there"), err)
		}
		return nil
	})
	if d := time.Since(deleted); d < 600*time.Millisecond {
		t.Errorf("gone %s after its deletion began, before the 600ms termination delay", d)
	}
	t.Logf("gone %s after its deletion began (termination delay 600ms)", time.Since(deleted).Round(time.Millisecond))
	testutil.EventuallyTrue(t, 5*time.Second, "the address closed", func() bool { return n.State(ip) == Closed })

	// kwok restarted the pod once for its one labelling, though it may
	// have seen the pod again before the label's removal.
	var events corev1.EventList
	if err := k8s.List(ctx, &events, client.InNamespace(key.Namespace), client.MatchingFields{"involvedObject.name": key.Name}); err != nil {
		t.Fatal(err)
	}
	restarts := 0
	for _, e := range events.Items {
		if e.Reason == "Started" && strings.Contains(e.Message, "chaos restart") {
			restarts += int(max(e.Count, 1))
		}
	}
	if restarts != 1 {
		t.Errorf("kwok restarted the pod %d times for one labelling", restarts)
	}
}

func setLabel(t *testing.T, k8s client.Client, key client.ObjectKey, label, value string) {
	t.Helper()
	var p corev1.Pod
	if err := k8s.Get(context.Background(), key, &p); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(p.DeepCopy())
	if value == "" {
		delete(p.Labels, label)
	} else {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[label] = value
	}
	if err := k8s.Patch(context.Background(), &p, patch); err != nil {
		t.Fatal(err)
	}
}

func httpGet(t *testing.T, ip string, port int) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	s, err := get(c, ip, port)
	if err != nil {
		t.Fatalf("GET %s:%d: %v", ip, port, err)
	}
	return s
}
