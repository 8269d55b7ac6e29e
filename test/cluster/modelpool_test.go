package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// TestModelPoolFollowsScale runs `tiergate controller` and two `tiergate
// dispatcher` processes (on the addresses kwok gave the pods of
// config/dispatcher) for the pool of config/samples, whose model
// Deployment is scaled 6 -> 3 -> 6 with kubectl. The ModelPool's
// status.readyReplicas and the slots and backends the dispatchers hold
// follow; how long each step takes is logged, and so is any moment the
// dispatchers held more slots than their Ready backends can serve (what
// issue 24 reports; not asserted here).
func TestModelPoolFollowsScale(t *testing.T) {
	ns := newNamespace(t)
	token := filepath.Join(t.TempDir(), "push-token")
	if err := os.WriteFile(token, []byte("cluster-e2e-push-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminPort, dataPort := dispatcherPorts(t)
	startController(t, token)

	applied := startStep(t)
	kubectl.MustInput(t, samples(t, adminPort), "apply", "-n", ns, "-f", "-")
	kubectl.Must(t, "apply", "-n", ns, "-k", filepath.Join(repoRoot, "config", "dispatcher"))
	ds := startDispatchers(t, ns, 2, adminPort, dataPort, token)
	applied.done("2 dispatcher processes on their pods' addresses")
	w := watchPolicies(t, ds)
	awaitFollow(t, ns, w, 6, 30*time.Second)
	applied.done("6 model pods Ready; pool and dispatchers hold 6 x 4 slots")
	w.forget() // the start-up, before the first Ready pods, is not a scale

	for _, n := range []int{3, 6} {
		scaled := startStep(t)
		kubectl.Must(t, "scale", "-n", ns, "deployment/llm", "--replicas="+strconv.Itoa(n))
		scaled.done(fmt.Sprintf("kubectl scale to %d returned", n))
		awaitPods(t, ns, fmt.Sprintf("%d Ready model pods", n), func(pods []corev1.Pod) bool { return len(readyServing(pods)) == n })
		podsAt := scaled.done(fmt.Sprintf("%d Ready, non-terminating model pods", n))
		await(t, 30*time.Second, "the Deployment's readyReplicas", func() (bool, string) {
			s := deployment(t, ns).Status
			return int(s.ReadyReplicas) == n, fmt.Sprintf("status %+v", s)
		})
		scaled.done(fmt.Sprintf("Deployment status.readyReplicas %d", n))
		awaitFollow(t, ns, w, n, 30*time.Second)
		all := scaled.done(fmt.Sprintf("pool status and dispatchers at %d x 4 slots", n))
		t.Logf("%-62s %8s", "  of which after the pods' readiness changed", (all - podsAt).Round(time.Millisecond))
	}
	w.stop()
	over, worst, n := w.overcommitted()
	if over > 0 {
		t.Logf("during the scales the dispatchers held more slots than 4 x their backends in %d of %d samples (every 10ms); the worst: %s", over, n, worst)
	} else {
		t.Logf("during the scales the dispatchers never held more slots than 4 x their backends (%d samples, every 10ms)", n)
	}
}

// dispatcherPorts are two ports free on every address of the pod CIDR
// (a dispatcher pod may get any of them): the pool's admin port and the
// dispatchers' data port.
func dispatcherPorts(t *testing.T) (admin, data int) {
	t.Helper()
	var others []string
	for i := 2; i < 255; i++ {
		others = append(others, podAddr(i))
	}
	ports, err := testutil.FreePorts(podAddr(1), 2, others...)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0], ports[1]
}

// podAddr is the host-th address of the pod CIDR (a /24).
func podAddr(host int) string {
	p := podNet.Prefix().Addr().As4()
	p[3] = byte(host)
	return net.IP(p[:]).String()
}

// startController runs `tiergate controller` as the cluster's admin.
func startController(t *testing.T, token string) {
	t.Helper()
	probe, metrics := testutil.FreeAddr(t, "127.0.0.1"), testutil.FreeAddr(t, "127.0.0.1")
	cmd := exec.Command(bins.Tiergate, "controller",
		"--kubeconfig", kc.Kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address", metrics,
		"--health-probe-bind-address", probe,
		"--push-token-file", token,
		"--push-timeout", "1s",
	)
	p := testutil.StartT(t, cmd, testutil.Options{Name: "tiergate controller", Grace: 10 * time.Second, LogBytes: 20000})
	testutil.WaitHTTP(t, p, "http://"+probe+"/readyz", http.StatusOK, 30*time.Second)
}

// samples are config/samples with the pool's admin and backend ports and
// the model server's port set to this cluster's.
func samples(t *testing.T, adminPort int) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "config", "samples", "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("config/samples: %v, %d files", err, len(files))
	}
	model := strconv.Itoa(podNet.Port())
	var docs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		switch {
		case strings.Contains(s, "kind: ModelPool"):
			s = replaceOnce(t, s, "adminPort: 9090", "adminPort: "+strconv.Itoa(adminPort))
			s = replaceOnce(t, s, "port: 8000", "port: "+model)
		case strings.Contains(s, "kind: Deployment"):
			s = replaceOnce(t, s, "--port=8000", "--port="+model)
			s = replaceOnce(t, s, "containerPort: 8000", "containerPort: "+model)
		}
		docs = append(docs, s)
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

// startDispatchers waits for n dispatcher pods to get addresses and runs
// a dispatcher process on each (kwok, not the process's /readyz, makes
// the pod Ready: kwok plays no probes).
func startDispatchers(t *testing.T, ns string, n, adminPort, dataPort int, token string) []*testutil.Dispatcher {
	t.Helper()
	var ips []string
	await(t, 30*time.Second, "dispatcher pods with addresses", func() (bool, string) {
		var pods corev1.PodList
		if err := k8s.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/name": "tiergate-dispatcher"}); err != nil {
			t.Fatal(err)
		}
		ips = ips[:0]
		for _, p := range pods.Items {
			if p.Status.PodIP != "" {
				ips = append(ips, p.Status.PodIP)
			}
		}
		return len(ips) == n, describePods(pods.Items)
	})
	var ds []*testutil.Dispatcher
	for i, ip := range ips {
		ds = append(ds, testutil.StartDispatcher(t, bins.Tiergate, testutil.DispatcherOptions{
			Options:   testutil.Options{Name: fmt.Sprintf("dispatcher %d (%s)", i, ip), Grace: 10 * time.Second, LogBytes: 8000},
			Data:      net.JoinHostPort(ip, strconv.Itoa(dataPort)),
			Admin:     net.JoinHostPort(ip, strconv.Itoa(adminPort)),
			TokenFile: token,
			Args:      []string{"--drain-timeout", "1s"},
		}))
	}
	return ds
}

// held is what every dispatcher holds at one moment.
type held struct {
	at       time.Time
	slots    int      // summed over the dispatchers
	backends []string // the fewest any dispatcher holds
}

// policyWatch samples the dispatchers' policies every 10 ms.
type policyWatch struct {
	ds   []*testutil.Dispatcher
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	last    *held
	samples []held
}

func watchPolicies(t *testing.T, ds []*testutil.Dispatcher) *policyWatch {
	w := &policyWatch{ds: ds, done: make(chan struct{})}
	w.wg.Add(1)
	go w.run()
	t.Cleanup(w.stop)
	return w
}

func (w *policyWatch) run() {
	defer w.wg.Done()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if h, ok := w.sample(); ok {
			w.mu.Lock()
			w.last = &h
			w.samples = append(w.samples, h)
			w.mu.Unlock()
		}
		select {
		case <-w.done:
			return
		case <-tick.C:
		}
	}
}

func (w *policyWatch) sample() (held, bool) {
	h := held{at: time.Now()}
	for i, d := range w.ds {
		p, err := appliedPolicy(d)
		if err != nil {
			return held{}, false
		}
		h.slots += p.Slots
		var b []string
		for _, be := range p.Backends {
			b = append(b, be.Address)
		}
		slices.Sort(b)
		if i == 0 || len(b) < len(h.backends) {
			h.backends = b
		}
	}
	return h, true
}

// stop ends the sampling. Idempotent.
func (w *policyWatch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

func (w *policyWatch) current() (held, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		return held{}, false
	}
	return *w.last, true
}

// forget drops the samples so far.
func (w *policyWatch) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples = nil
}

// overcommitted counts the samples where the slots exceeded 4 per backend
// and describes the worst of them; n is how many samples there are.
func (w *policyWatch) overcommitted() (count int, worst string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	excess := 0
	for _, h := range w.samples {
		if e := h.slots - 4*len(h.backends); e > 0 {
			count++
			if e > excess {
				excess = e
				worst = fmt.Sprintf("%d slots over %d backends at %s", h.slots, len(h.backends), h.at.Format("15:04:05.000"))
			}
		}
	}
	return count, worst, len(w.samples)
}

// awaitFollow waits until the pool's status counts n Ready replicas and
// every dispatcher holds the Ready model pods as its backends, with 4n
// slots in all.
func awaitFollow(t *testing.T, ns string, w *policyWatch, n int, timeout time.Duration) {
	t.Helper()
	await(t, timeout, fmt.Sprintf("the pool and the dispatchers at %d replicas", n), func() (bool, string) {
		var pool v1alpha1.ModelPool
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "llm"}, &pool); err != nil {
			return false, err.Error()
		}
		want := readyServing(modelPods(t, ns))
		for i := range want {
			want[i] = net.JoinHostPort(want[i], strconv.Itoa(podNet.Port()))
		}
		slices.Sort(want)
		h, ok := w.current()
		why := fmt.Sprintf("pool readyReplicas %d poolConcurrency %d; dispatchers %d slots, backends %v; Ready pods %v",
			pool.Status.ReadyReplicas, pool.Status.PoolConcurrency, h.slots, h.backends, want)
		return ok && int(pool.Status.ReadyReplicas) == n && len(want) == n && h.slots == 4*n && slices.Equal(h.backends, want), why
	})
}

// appliedPolicy reads a dispatcher's policy through its admin API.
func appliedPolicy(d *testutil.Dispatcher) (*policy.Policy, error) {
	req, err := http.NewRequest(http.MethodGet, d.AdminURL("/v1/policy"), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/policy: %d %s", d.Admin, resp.StatusCode, b)
	}
	var p policy.Policy
	return &p, json.Unmarshal(b, &p)
}
