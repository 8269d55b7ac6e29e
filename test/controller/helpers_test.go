package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// subnet hands every test environment its own 127.77.N.0/24, so tests
// never collide on an address.
var subnet atomic.Int32

// procOpts name a child process; Cleanup stops it (SIGTERM, SIGKILL after
// 10s) and logs its output if the test failed.
func procOpts(name string) testutil.Options {
	return testutil.Options{Name: name, Grace: 10 * time.Second}
}

// dispatcher is a real `tiergate dispatcher` process (nil until it runs)
// and its Pod object.
type dispatcher struct {
	*testutil.Dispatcher
	pod string
	ip  string
}

// env is one test's namespace, addresses and processes.
type env struct {
	t         *testing.T
	ns        string
	net       int32 // the N of 127.77.N.0/24
	adminPort int
	dataPort  int
	modelPort int
	disp      []*dispatcher
	kubelet   *kubelet
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, net: subnet.Add(1)}
	e.ns = fmt.Sprintf("e2e-%s-%d", strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-")), e.net)
	if len(e.ns) > 60 {
		e.ns = e.ns[len(e.ns)-60:]
		e.ns = "e" + strings.TrimLeft(e.ns, "-")
	}
	ctx := context.Background()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// envtest has no namespace controller; delete what matters so the
		// controller stops pushing.
		_ = k8s.DeleteAllOf(ctx, &v1alpha1.ModelPool{}, client.InNamespace(e.ns))
		_ = k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(e.ns), client.GracePeriodSeconds(0))
	})
	ports, err := testutil.FreePorts(e.ip(2), 3, e.ip(3), e.ip(4), e.ip(5), e.ip(6), e.ip(10), e.ip(11), e.ip(12))
	if err != nil {
		t.Fatal(err)
	}
	e.adminPort, e.dataPort, e.modelPort = ports[0], ports[1], ports[2]
	e.kubelet = startKubelet(t)
	return e
}

// ip returns 127.77.N.host.
func (e *env) ip(host int) string { return fmt.Sprintf("127.77.%d.%d", e.net, host) }

// startDispatcher starts a dispatcher process on ip(host) with the given
// admin token file, and creates its Pod object, Ready only once the
// dispatcher's /readyz says so (the kubelet plays the readiness probe).
func (e *env) startDispatcher(name string, host int, tokenFile string, probed bool) *dispatcher {
	e.t.Helper()
	d := &dispatcher{pod: name, ip: e.ip(host)}
	d.run(e, tokenFile)
	e.createPod(name, map[string]string{"app.kubernetes.io/name": "tiergate-dispatcher"}, d.ip, false)
	if probed {
		e.kubelet.probe(e.ns, name, d.AdminURL("/readyz"))
	}
	e.disp = append(e.disp, d)
	return d
}

// run starts d's process on d.ip with e's ports and waits for /healthz.
func (d *dispatcher) run(e *env, tokenFile string) {
	e.t.Helper()
	d.Dispatcher = testutil.StartDispatcher(e.t, bins.Tiergate, testutil.DispatcherOptions{
		Options: procOpts("dispatcher " + d.pod),
		Data:    net.JoinHostPort(d.ip, fmt.Sprint(e.dataPort)), Admin: net.JoinHostPort(d.ip, fmt.Sprint(e.adminPort)),
		TokenFile: tokenFile, Args: []string{"--drain-timeout", "1s"},
	})
}

// pushes counts the policies d was pushed and applied, resyncs included.
func (d *dispatcher) pushes() int { return strings.Count(d.Output(), `"msg"="applied policy"`) }

// waitPushes waits until d has applied n more pushes than it had when
// pushes said since.
func (d *dispatcher) waitPushes(t *testing.T, since, n int) {
	t.Helper()
	d.WaitOutput(t, 10*time.Second, fmt.Sprintf("%s applies %d more pushes", d.pod, n), func(out string) bool {
		return strings.Count(out, `"msg"="applied policy"`) >= since+n
	})
}

// createPod creates a Pod and sets its status as a kubelet would.
func (e *env) createPod(name string, labels map[string]string, ip string, ready bool) {
	e.t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.invalid/none"}}},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	setReadyCondition(pod, ready)
	if err := k8s.Status().Update(ctx, pod); err != nil {
		e.t.Fatal(err)
	}
}

func setReadyCondition(pod *corev1.Pod, ready bool) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady {
			pod.Status.Conditions[i].Status = st
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()})
}

func podIsReady(ns, name string) (bool, error) {
	var pod corev1.Pod
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &pod); err != nil {
		return false, err
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// modelPods creates n Ready model pods (the Deployment's selector) on
// ip(10), ip(11), ... and returns their backend addresses, sorted.
func (e *env) modelPods(n int) []policy.Backend {
	e.t.Helper()
	var out []policy.Backend
	for i := 0; i < n; i++ {
		ip := e.ip(10 + i)
		e.createPod(fmt.Sprintf("llm-%d", i), map[string]string{"app.kubernetes.io/name": "llm"}, ip, true)
		out = append(out, policy.Backend{Address: net.JoinHostPort(ip, fmt.Sprint(e.modelPort)), Scheme: "http"})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Address < out[b].Address })
	return out
}

// applySamples applies config/samples with bin/k8s/kubectl, with the
// pool's admin and backend ports set to this environment's.
func (e *env) applySamples(mutate ...func(string) string) {
	e.t.Helper()
	dir := filepath.Join(repoRoot, "config", "samples")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 4 {
		e.t.Fatalf("config/samples: %v, %d files", err, len(files))
	}
	var docs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			e.t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, "kind: ModelPool") {
			s = replaceOnce(e.t, s, "adminPort: 9090", fmt.Sprintf("adminPort: %d", e.adminPort))
			s = replaceOnce(e.t, s, "port: 8000", fmt.Sprintf("port: %d", e.modelPort))
			for _, m := range mutate {
				s = m(s)
			}
		}
		docs = append(docs, s)
	}
	kubectl.MustInput(e.t, strings.Join(docs, "\n---\n"), "apply", "-n", e.ns, "-f", "-")
}

func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if strings.Count(s, old) != 1 {
		t.Fatalf("sample does not contain %q exactly once", old)
	}
	return strings.Replace(s, old, new, 1)
}

// setReadyReplicas plays the autoscaler: it sets the Deployment's status.
func (e *env) setReadyReplicas(n int32) {
	e.t.Helper()
	ctx := context.Background()
	var d appsv1.Deployment
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "llm"}, &d); err != nil {
		e.t.Fatal(err)
	}
	d.Status.Replicas = max(n, 6)
	d.Status.UpdatedReplicas = d.Status.Replicas
	d.Status.ReadyReplicas = n
	d.Status.AvailableReplicas = n
	d.Status.ObservedGeneration = d.Generation
	if err := k8s.Status().Update(ctx, &d); err != nil {
		e.t.Fatal(err)
	}
}

// getPolicy reads a dispatcher's applied policy through its admin API.
func getPolicy(d *dispatcher) (*policy.Policy, error) {
	req, _ := http.NewRequest(http.MethodGet, d.AdminURL("/v1/policy"), nil)
	req.Header.Set("Authorization", "Bearer "+d.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/policy: %d %s", d.Admin, resp.StatusCode, b)
	}
	var p policy.Policy
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func (e *env) pool() *v1alpha1.ModelPool {
	e.t.Helper()
	var p v1alpha1.ModelPool
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "llm"}, &p); err != nil {
		e.t.Fatal(err)
	}
	return &p
}

func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// conditionIs returns nil when the condition has the status and reason.
func conditionIs(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) error {
	c := condition(conds, typ)
	if c == nil {
		return fmt.Errorf("no %s condition", typ)
	}
	if c.Status != status || c.Reason != reason {
		return fmt.Errorf("%s is %s/%s (%s), want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return nil
}

// kubelet plays the readiness probe of dispatcher pods: it polls their
// /readyz and copies the answer into the Pod's Ready condition.
type kubelet struct {
	mu     sync.Mutex
	pods   map[types.NamespacedName]string
	stop   chan struct{}
	done   chan struct{}
	errors []error
}

func startKubelet(t *testing.T) *kubelet {
	k := &kubelet{pods: map[types.NamespacedName]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go k.run()
	t.Cleanup(func() {
		close(k.stop)
		<-k.done
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, err := range k.errors {
			t.Errorf("kubelet: %v", err)
		}
	})
	return k
}

func (k *kubelet) probe(ns, name, url string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods[types.NamespacedName{Namespace: ns, Name: name}] = url
}

func (k *kubelet) forget(ns, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pods, types.NamespacedName{Namespace: ns, Name: name})
}

func (k *kubelet) run() {
	defer close(k.done)
	c := &http.Client{Timeout: 500 * time.Millisecond}
	for {
		select {
		case <-k.stop:
			return
		case <-time.After(25 * time.Millisecond):
		}
		k.mu.Lock()
		pods := make(map[types.NamespacedName]string, len(k.pods))
		for n, u := range k.pods {
			pods[n] = u
		}
		k.mu.Unlock()
		for name, url := range pods {
			ready := false
			if resp, err := c.Get(url); err == nil {
				ready = resp.StatusCode == http.StatusOK
				resp.Body.Close()
			}
			var pod corev1.Pod
			if err := k8s.Get(context.Background(), name, &pod); err != nil {
				if !apierrors.IsNotFound(err) {
					k.fail(err)
				}
				continue
			}
			cur := false
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady {
					cur = c.Status == corev1.ConditionTrue
				}
			}
			if cur == ready {
				continue
			}
			setReadyCondition(&pod, ready)
			if err := k8s.Status().Update(context.Background(), &pod); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				k.fail(err)
			}
		}
	}
}

func (k *kubelet) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.errors = append(k.errors, err)
}

// allHold waits until every dispatcher in ds holds a policy that check
// accepts, and returns how long that took.
func allHold(ds []*dispatcher, timeout time.Duration, check func(*policy.Policy) error) (time.Duration, error) {
	start := time.Now()
	err := testutil.Poll(timeout, func() error {
		for _, d := range ds {
			p, err := getPolicy(d)
			if err != nil {
				return err
			}
			if err := check(p); err != nil {
				return fmt.Errorf("%s: %w", d.pod, err)
			}
		}
		return nil
	})
	return time.Since(start), err
}

var errMismatch = errors.New("mismatch")

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content+"\n"), 0o600) }
