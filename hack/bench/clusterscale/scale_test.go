package clusterscale

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
)

// EnableEnv runs TestClusterScale when set to 1; `make bench-cluster`
// sets it.
const EnableEnv = "TIERGATE_CLUSTER_SCALE"

// config is a run's size, from SCALE_* variables.
type config struct {
	Pods, Dispatchers, Quotas, Rounds, Nodes int
	ColdStart, TerminationDelay              time.Duration
	// Quiet is how long a change must go without an apply to be over.
	Quiet   time.Duration
	PodCIDR string
	// ControllerQPS, when not zero, is the controller's --kube-api-qps
	// (its burst twice that).
	ControllerQPS int
	// Out, when set, is where the figures are written as JSON.
	Out string
	// Profile, when set, is a directory that gets a CPU profile of the
	// controller for each change (cpu-<n>-<from>-<to>.pprof), taken over
	// ProfileFor from just before `kubectl scale`.
	Profile    string
	ProfileFor time.Duration
	// ControllerLog, when set, is a file that gets the controller's whole
	// log, run at --zap-log-level=debug (its V(1) lines time each reconcile).
	ControllerLog string
}

func configFromEnv(t *testing.T) config {
	t.Helper()
	c := config{
		Pods: envInt(t, "SCALE_PODS", 1000), Dispatchers: envInt(t, "SCALE_DISPATCHERS", 20),
		Quotas: envInt(t, "SCALE_QUOTAS", 200), Rounds: envInt(t, "SCALE_ROUNDS", 3), Nodes: envInt(t, "SCALE_NODES", 10),
		ColdStart: envDuration(t, "SCALE_COLD_START", 2*time.Second), TerminationDelay: envDuration(t, "SCALE_TERMINATION_DELAY", time.Second),
		Quiet: envDuration(t, "SCALE_QUIET", 3*time.Second), PodCIDR: randomPodCIDR(), ControllerQPS: envInt(t, "SCALE_CONTROLLER_QPS", 0), Out: os.Getenv("SCALE_OUT"),
		Profile: os.Getenv("SCALE_PROFILE"), ProfileFor: envDuration(t, "SCALE_PROFILE_FOR", 20*time.Second),
		ControllerLog: os.Getenv("SCALE_CONTROLLER_LOG"),
	}
	if c.ProfileFor < time.Second {
		t.Fatalf("SCALE_PROFILE_FOR %s must be at least 1s", c.ProfileFor)
	}
	if c.Pods < 2 || c.Dispatchers < 1 || c.Quotas < 0 || c.Rounds < 1 || c.Nodes < 1 || c.ControllerQPS < 0 {
		t.Fatalf("SCALE_PODS %d (>= 2), SCALE_DISPATCHERS %d (>= 1), SCALE_QUOTAS %d (>= 0), SCALE_ROUNDS %d and SCALE_NODES %d (>= 1)",
			c.Pods, c.Dispatchers, c.Quotas, c.Rounds, c.Nodes)
	}
	// Every pod and dispatcher at once, and the terminating half of a
	// scale-down, must fit the /21's 2,046 addresses.
	if c.Pods+c.Pods/2+c.Dispatchers > 2000 {
		t.Fatalf("SCALE_PODS %d and SCALE_DISPATCHERS %d need more addresses than the pod CIDR's 2,046", c.Pods, c.Dispatchers)
	}
	return c
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return d
}

// TestClusterScale is the cluster scale figure of docs/benchmarks.md:
// SCALE_PODS model pods on kwok, SCALE_DISPATCHERS dispatcher processes
// and SCALE_QUOTAS TenantQuotas, with the model Deployment scaled by
// kubectl from SCALE_PODS to half and back, SCALE_ROUNDS times. For each
// change it measures how long after the readiness change every dispatcher
// held the new policy, the controller's CPU time and peak RSS, and the
// API requests the controller made.
func TestClusterScale(t *testing.T) {
	if os.Getenv(EnableEnv) != "1" {
		t.Skipf("%s is not 1; run `make bench-cluster`", EnableEnv)
	}
	cfg := configFromEnv(t)
	load := loadAverage()
	b := setUp(t, cfg)
	b.awaitChange(t, change{To: cfg.Pods}, 10*time.Minute)
	t.Logf("set-up: %d pods Ready and held by %d dispatchers; load average %s before it", cfg.Pods, cfg.Dispatchers, load)
	first := b.sample(t) // the run's figures start after the set-up
	var changes []change
	for range cfg.Rounds {
		for _, n := range []int{cfg.Pods / 2, cfg.Pods} {
			c := b.scale(t, n, len(changes))
			t.Logf("%s", c.line())
			changes = append(changes, c)
		}
	}
	r := b.result(t, first, changes, load)
	t.Logf("\n%s", r.table())
	if cfg.Out != "" {
		if err := r.write(cfg.Out); err != nil {
			t.Error(err)
		}
	}
}

// loadAverage is /proc/loadavg's three averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// scale runs `kubectl scale` to n and waits for the change to end; the
// i-th change is profiled when cfg.Profile says so.
func (b *bench) scale(t *testing.T, n, i int) change {
	t.Helper()
	before := b.sample(t)
	c := change{From: b.current, To: n, Start: time.Now()}
	profiled := b.profile(t, fmt.Sprintf("cpu-%d-%d-%d.pprof", i, c.From, n))
	b.kubectl.Must(t, "scale", "-n", ns, "deployment/llm", "--replicas="+strconv.Itoa(n))
	c = b.awaitChange(t, c, 5*time.Minute)
	c.measure(b, before, b.sample(t))
	if err := <-profiled; err != nil {
		t.Errorf("profiling the controller: %v", err)
	}
	return c
}

// dispatcherLogs parses every dispatcher's applied policies.
func (b *bench) dispatcherLogs(t *testing.T) [][]Applied {
	t.Helper()
	out := make([][]Applied, len(b.ds))
	for i, d := range b.ds {
		lines, err := ParseApplied(d.Output(), time.Local)
		if err != nil {
			t.Fatalf("dispatcher %d's log: %v", i, err)
		}
		out[i] = lines
	}
	return out
}

// settledAll reports when each dispatcher settled on c.To backends since
// c.Start, if all have and their slots add up to the pool's.
func (b *bench) settledAll(t *testing.T, c change) (at []time.Time, why string) {
	t.Helper()
	slots := 0
	var behind []string
	for i, lines := range b.dispatcherLogs(t) {
		s, last, ok := Settled(lines, c.Start, c.To)
		if !ok {
			got := "none"
			if len(lines) > 0 {
				got = fmt.Sprintf("%d backends", lines[len(lines)-1].Backends)
			}
			behind = append(behind, fmt.Sprintf("%d (%s)", i, got))
			continue
		}
		at = append(at, s)
		slots += last.Slots
	}
	if len(behind) > 0 {
		return nil, fmt.Sprintf("dispatchers %s not at %d backends", strings.Join(behind, ", "), c.To)
	}
	if want := concurrencyPerReplica * c.To; slots != want {
		return nil, fmt.Sprintf("the dispatchers hold %d slots, want %d", slots, want)
	}
	return at, ""
}

// concurrencyPerReplica is config/samples' pool's.
const concurrencyPerReplica = 4

// awaitChange waits until the pool is at c.To Ready pods, no pod
// terminates, the Deployment's status says so and every dispatcher holds
// c.To backends with the pool's slots, then for c.Quiet without an apply.
func (b *bench) awaitChange(t *testing.T, c change, timeout time.Duration) change {
	t.Helper()
	var why string
	// Every time comes from a watch or a log, not from this loop, so it
	// may look only ten times a second.
	err := poll(timeout, 100*time.Millisecond, func() error {
		var ok, now bool
		if c.ReadyAt, ok, now = b.pool.ready.reached(c.Start, c.To); !ok || !now {
			return fmt.Errorf("ready pods not at %d", c.To)
		}
		if _, _, now = b.pool.total.reached(c.Start, c.To); !now {
			return fmt.Errorf("pods (terminating ones too) not at %d", c.To)
		}
		if c.DeploymentAt, ok, now = b.pool.deployReady.reached(c.Start, c.To); !ok || !now {
			return fmt.Errorf("the Deployment's status not at %d", c.To)
		}
		var at []time.Time
		if at, why = b.settledAll(t, c); at == nil {
			return fmt.Errorf("%s", why)
		}
		c.Settled = at
		return nil
	})
	if err != nil {
		t.Fatalf("the scale %d -> %d did not end within %s: %v (%s)\n%s", c.From, c.To, timeout, err, why, b.kc.Logs(20))
	}
	b.awaitQuiet(t, c)
	// The statuses for people follow the policy (a quiet second, at a
	// paced 20 writes a second): they belong to this change, not the next.
	c.End = b.awaitWritesQuiet(t)
	b.current = c.To
	return c
}

// poll calls f every period until it returns nil, or returns its last
// error after timeout.
func poll(timeout, period time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(period)
	}
}

// awaitQuiet waits until no dispatcher applied a policy for c.Quiet (at
// most a minute on).
func (b *bench) awaitQuiet(t *testing.T, c change) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		last := c.Start
		for _, lines := range b.dispatcherLogs(t) {
			if n := len(lines); n > 0 && lines[n-1].At.After(last) {
				last = lines[n-1].At
			}
		}
		if time.Since(last) >= b.cfg.Quiet || time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitWritesQuiet waits until the controller has made no write for
// cfg.Quiet by its own counter (at most two minutes on), and returns then.
func (b *bench) awaitWritesQuiet(t *testing.T) time.Time {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	last, since := -1, time.Now()
	for {
		_, w := RESTClientRequests(testutil.Scrape(t, "http://"+b.ctrlMetrics+"/metrics"))
		if w != last {
			last, since = w, time.Now()
		}
		if time.Since(since) >= b.cfg.Quiet || time.Now().After(deadline) {
			return time.Now()
		}
		time.Sleep(250 * time.Millisecond)
	}
}
