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
// Deployment is scaled 6 -> 3 -> 6 with kubectl while a load runs. The
// ModelPool's status.readyReplicas and the slots and backends the
// dispatchers hold follow; how long each step takes is logged. Asserted
// over the whole scale: every policy a dispatcher applied (its log) has
// no more slots than 4 × its backends; every request is answered 200
// (no 502 from a terminating pod: the sample's preStop sleep, which the
// pod network plays, outlasts the push); each deleted pod is out of
// every dispatcher's policy within dropCeiling of the test seeing its
// deletion begin (the median is logged against issue 24's 100 ms); no
// version is applied twice by a dispatcher (the resync is set far beyond the test);
// and the controller logs no error (a status-write conflict is retried
// quietly).
func TestModelPoolFollowsScale(t *testing.T) {
	p := startPool(t)
	ns, ds, w := p.ns, p.ds, p.w

	ld := startLoad(t, ds, 20*time.Millisecond)
	scaleStart := time.Now()
	var downEnd time.Time
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
		if n == 3 {
			downEnd = time.Now()
		}
	}
	ld.stop()
	w.stop()

	logs := p.logs(t)
	checkAppliesWithinBackends(t, logs)
	checkNoDuplicateApplies(t, logs)
	checkDropLatency(t, w, logs, p.dels.since(scaleStart), downEnd, 3)
	answered, failures := ld.result()
	t.Logf("load: %d requests answered 200 during the scales", answered)
	if failures != "" || answered == 0 {
		t.Errorf("load during the scales: %d answered, and %s", answered, failures)
	}
	checkControllerQuiet(t, ns, p.ctl.Output())
}

// checkAppliesWithinBackends: no policy a dispatcher applied had more
// slots than concurrencyPerReplica (4) × the backends in it, and no
// version had more slots over the dispatchers (Local mode splits the
// pool's) than 4 × its backends.
func checkAppliesWithinBackends(t *testing.T, logs [][]applied) {
	t.Helper()
	total := 0
	for i, log := range logs {
		total += len(log)
		if over := overBackends(log, 4); len(over) > 0 {
			t.Errorf("dispatcher %d applied %d of %d policies with more slots than 4 × their backends: %s", i, len(over), len(log), describeApplies(over))
		}
	}
	versions := poolSlots(logs)
	if over := overBackends(versions, 4); len(over) > 0 {
		t.Errorf("%d of %d versions had more slots over the dispatchers than 4 × their backends: %s", len(over), len(versions), describeApplies(over))
	}
	t.Logf("%d policies (%d versions) applied by the dispatchers during the scales, each checked for slots <= 4 x backends", total, len(versions))
}

// checkNoDuplicateApplies: no dispatcher applied a version twice.
func checkNoDuplicateApplies(t *testing.T, logs [][]applied) {
	t.Helper()
	for i, log := range logs {
		if n, versions := duplicates(log); n > 0 {
			t.Errorf("dispatcher %d applied %d versions again (versions %v): %s", i, n, versions, describeApplies(log))
		}
	}
}

// dropCeiling is what checkDropLatency asserts on every deletion of a
// run; issue 24's target, 100 ms, is logged against the median. A drop's
// path is the pod event, one reconcile (cache reads and the bounds; the
// version is within the reserved block, so no status write comes first)
// and one PUT per dispatcher. Measured: maxima 2-12 ms on a quiet
// machine, 6-135 ms with six busy loops on its two cores (the 135 ms is
// one reconcile for all three deletions, waiting for a CPU). 300 ms holds
// on a machine loaded so, and leaves the preStop sleep (1 s here, 5 s in
// the sample) ample room.
const (
	dropTarget  = 100 * time.Millisecond
	dropCeiling = 300 * time.Millisecond
)

// checkDropLatency: each deleted pod (want of them) was out of every
// dispatcher's policy within dropCeiling; the latencies' p50, p99 and max
// are logged, the p50 against dropTarget.
func checkDropLatency(t *testing.T, w *policyWatch, logs [][]applied, dels []deletion, until time.Time, want int) {
	t.Helper()
	if len(dels) != want {
		t.Fatalf("saw %d model pods' deletion begin, want %d: %+v", len(dels), want, dels)
	}
	var lat []time.Duration
	for _, d := range dels {
		l, ok := dropLatency(w, logs, d, until)
		if !ok {
			t.Errorf("pod %s (%s) was still in some dispatcher's policy at the end of the scale", d.name, d.ip)
			continue
		}
		if l > dropCeiling {
			t.Errorf("pod %s (%s) left the last dispatcher's policy %s after its deletion began (seen %s), want <= %s",
				d.name, d.ip, l.Round(time.Millisecond), d.seen.Format("15:04:05.000"), dropCeiling)
		}
		lat = append(lat, l)
	}
	t.Logf("deleted pod out of every dispatcher's policy after its deletion began: p50 %s (target %s), p99 %s, max %s (asserted <= %s) over %d pods",
		percentile(lat, 0.5).Round(time.Millisecond), dropTarget, percentile(lat, 0.99).Round(time.Millisecond),
		percentile(lat, 1).Round(time.Millisecond), dropCeiling, len(lat))
}

// checkControllerQuiet: the controller logged nothing at error level
// about ns (an optimistic-lock conflict on the pool's status is retried
// quietly). Lines about other namespaces are another test's leftovers: a
// pool of an earlier run (-count) whose namespace is still terminating.
func checkControllerQuiet(t *testing.T, ns, out string) {
	t.Helper()
	lines, conflicts := controllerErrors(out, ns)
	if len(lines) > 0 {
		t.Errorf("the controller logged %d errors, %d of them status-write conflicts; the first: %s", len(lines), conflicts, lines[0])
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

// startController runs `tiergate controller` as the cluster's admin, with
// no periodic resync within a test (a resync applies the same version
// again, by design).
func startController(t *testing.T, token string) *testutil.Process {
	t.Helper()
	probe, metrics := testutil.FreeAddr(t, "127.0.0.1"), testutil.FreeAddr(t, "127.0.0.1")
	cmd := exec.Command(bins.Tiergate, "controller",
		"--kubeconfig", kc.Kubeconfig,
		"--leader-elect=false",
		"--metrics-bind-address", metrics,
		"--health-probe-bind-address", probe,
		"--push-token-file", token,
		"--push-timeout", "1s",
		"--resync-period", "10m",
	)
	p := testutil.StartT(t, cmd, testutil.Options{Name: "tiergate controller", Grace: 10 * time.Second, LogBytes: 20000})
	testutil.WaitHTTP(t, p, "http://"+probe+"/readyz", http.StatusOK, 30*time.Second)
	return p
}

// samples are config/samples with the pool's admin and backend ports and
// the model server's port set to this cluster's, each document then
// through edits.
func samples(t *testing.T, adminPort int, edits ...edit) string {
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
			// The preStop sleep at this suite's time scale: shorter than
			// the pods' termination delay, as the sample's 5s is than its
			// grace period.
			s = replaceOnce(t, s, "sleep:\n                seconds: 5", "sleep:\n                seconds: 1")
		}
		for _, e := range edits {
			s = e(t, s)
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
			Args:      []string{"--drain-timeout", "1s", "--log-format", "json"},
		}))
	}
	return ds
}

// held is what every dispatcher holds at one moment.
type held struct {
	at       time.Time
	slots    int      // summed over the dispatchers
	backends []string // the fewest any dispatcher holds
	per      []view   // each dispatcher's, in the watch's order
}

// view is the policy one dispatcher holds.
type view struct {
	version  int64
	slots    int
	backends []string
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
		h.per = append(h.per, view{version: p.Version, slots: p.Slots, backends: b})
	}
	return h, true
}

// all are the samples since the last forget.
func (w *policyWatch) all() []held {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.samples)
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
