package clusterscale

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
)

// change is one scale of the model Deployment and what it cost.
type change struct {
	From, To int
	// Start is just before `kubectl scale`; ReadyAt when the pool watch
	// first counted To Ready, non-terminating pods; DeploymentAt when the
	// Deployment's status first said To replicas, all Ready; End when the
	// dispatchers had gone Quiet without an apply.
	Start, ReadyAt, DeploymentAt, End time.Time
	// Settled is when each dispatcher began to hold its final policy.
	Settled []time.Time `json:"-"`

	// Latency is from ReadyAt to the last dispatcher's Settled;
	// FromDeployment from DeploymentAt to it; PerDispatcher each
	// dispatcher's from ReadyAt.
	Latency, FromDeployment time.Duration
	PerDispatcher           []time.Duration
	// Versions are the distinct policy versions the dispatchers applied
	// during the change, Applies how many applies (PUTs taken) in all,
	// Duplicates the applies of a version the dispatcher already held.
	Versions, Applies, Duplicates int
	// CPU is the controller's CPU time over the change, PeakRSS its
	// highest resident set (sampled every 100 ms).
	CPU     time.Duration
	PeakRSS int64
	// REST are the controller's own counts (rest_client_requests_total),
	// Audit the API server's of the controller's user.
	REST  Requests
	Audit Requests
	// Applied are the first dispatcher's applies during the change, and
	// Writes when the controller's writes began and ended, both from
	// ReadyAt: the change's timeline.
	Applied []Step
	Writes  [2]time.Duration
}

// Step is one apply of a change's timeline.
type Step struct {
	AfterReady      time.Duration
	Version         int64
	Backends, Slots int
}

// snapshot is the controller's counters at one moment.
type snapshot struct {
	proc        ProcSample
	reads, writ int
}

func (b *bench) sample(t *testing.T) snapshot {
	t.Helper()
	p, err := ReadProc(b.ctrl.Pid())
	if err != nil {
		t.Fatalf("the controller's /proc: %v", err)
	}
	r, w := RESTClientRequests(testutil.Scrape(t, "http://"+b.ctrlMetrics+"/metrics"))
	return snapshot{proc: p, reads: r, writ: w}
}

// measure fills in what the change cost, from the samples before and
// after it and the dispatchers' logs.
func (c *change) measure(b *bench, before, after snapshot) {
	last := slices.MaxFunc(c.Settled, time.Time.Compare)
	c.Latency = last.Sub(c.ReadyAt)
	c.FromDeployment = last.Sub(c.DeploymentAt)
	c.PerDispatcher = nil
	for _, s := range c.Settled {
		c.PerDispatcher = append(c.PerDispatcher, s.Sub(c.ReadyAt))
	}
	versions := map[int64]bool{}
	c.Applies, c.Duplicates = 0, 0
	for _, d := range b.ds {
		lines, err := ParseApplied(d.Output(), time.Local)
		if err != nil {
			continue // settledAll parsed them a moment ago
		}
		held := map[int64]bool{}
		for _, l := range Since(lines, c.Start) {
			if !l.At.Before(c.End) {
				break
			}
			if d == b.ds[0] {
				c.Applied = append(c.Applied, Step{AfterReady: l.At.Sub(c.ReadyAt), Version: l.Version, Backends: l.Backends, Slots: l.Slots})
			}
			if held[l.Version] {
				c.Duplicates++
			}
			held[l.Version], versions[l.Version] = true, true
			c.Applies++
		}
	}
	c.Versions = len(versions)
	c.CPU = after.proc.CPU - before.proc.CPU
	c.PeakRSS = b.rss.take()
	c.REST = Requests{Reads: after.reads - before.reads, Writes: after.writ - before.writ}
}

func (c change) line() string {
	return fmt.Sprintf("scale %d -> %d: Ready %s after kubectl scale; every dispatcher held it %s later (%s after the Deployment's status); %d versions, %d applies (%d duplicates); controller CPU %s, peak RSS %s, REST %d reads %d writes",
		c.From, c.To, c.ReadyAt.Sub(c.Start).Round(time.Millisecond), c.Latency.Round(time.Millisecond), c.FromDeployment.Round(time.Millisecond),
		c.Versions, c.Applies, c.Duplicates, c.CPU, mib(c.PeakRSS), c.REST.Reads, c.REST.Writes)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// result is a run's figures.
type result struct {
	Config                       config
	LoadBefore, LoadAfter        string
	Changes                      []change
	P50, P99                     time.Duration // of the changes' Latency
	DispatcherP50, DispatcherP99 time.Duration // of every PerDispatcher
	// CPU is the controller's over the changes; HWM its peak RSS since it
	// started (the set-up included), RSS at the end.
	CPU      time.Duration
	HWM, RSS int64
	REST     Requests
	Audit    Requests
}

func (b *bench) result(t *testing.T, first snapshot, changes []change, load string) result {
	t.Helper()
	end := b.sample(t)
	r := result{Config: b.cfg, LoadBefore: load, LoadAfter: loadAverage(), Changes: changes,
		CPU: end.proc.CPU - first.proc.CPU, HWM: end.proc.HWM, RSS: end.proc.RSS,
		REST: Requests{Reads: end.reads - first.reads, Writes: end.writ - first.writ}}
	f, err := os.Open(b.auditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := ParseAudit(f)
	if err != nil {
		t.Fatal(err)
	}
	var lat, per []time.Duration
	r.Audit.WritesBy = map[string]int{}
	for i := range r.Changes {
		c := &r.Changes[i]
		c.Audit = CountRequests(evs, controllerUser, c.Start, c.End)
		c.Writes = writeSpan(evs, c)
		r.Audit.Reads += c.Audit.Reads
		r.Audit.Writes += c.Audit.Writes
		for k, v := range c.Audit.WritesBy {
			r.Audit.WritesBy[k] += v
		}
		lat = append(lat, c.Latency)
		per = append(per, c.PerDispatcher...)
	}
	r.P50, r.P99 = Percentile(lat, .5), Percentile(lat, .99)
	r.DispatcherP50, r.DispatcherP99 = Percentile(per, .5), Percentile(per, .99)
	return r
}

// writeSpan is when the controller's first and last writes of c were
// received, from c.ReadyAt.
func writeSpan(evs []AuditEvent, c *change) [2]time.Duration {
	var first, last time.Time
	for _, e := range evs {
		if e.User != controllerUser || isRead(e.Verb) || e.At.Before(c.Start) || !e.At.Before(c.End) {
			continue
		}
		if first.IsZero() {
			first = e.At
		}
		last = e.At
	}
	if first.IsZero() {
		return [2]time.Duration{}
	}
	return [2]time.Duration{first.Sub(c.ReadyAt), last.Sub(c.ReadyAt)}
}

// timeline is a change's applies and writes, relative to its readiness
// change.
func (c change) timeline() string {
	var parts []string
	for _, s := range c.Applied {
		parts = append(parts, fmt.Sprintf("v%d %d backends %d slots at %+dms", s.Version, s.Backends, s.Slots, s.AfterReady.Milliseconds()))
	}
	return fmt.Sprintf("%d -> %d: the Deployment's status at %+dms; dispatcher 0 applied %s; the controller's writes from %+dms to %+dms",
		c.From, c.To, c.DeploymentAt.Sub(c.ReadyAt).Milliseconds(), strings.Join(parts, ", "), c.Writes[0].Milliseconds(), c.Writes[1].Milliseconds())
}

// table is the run as Markdown, for docs/benchmarks.md.
func (r result) table() string {
	var s strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%d", d.Milliseconds()) }
	fmt.Fprintf(&s, "| change | kubectl scale → Ready (ms) | Ready → all dispatchers (ms) | Deployment status → all (ms) | versions | applies (duplicates) | controller CPU (ms) | peak RSS | reads (REST / audit) | writes (REST / audit) | writes by resource (audit) |\n")
	fmt.Fprintf(&s, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Changes {
		fmt.Fprintf(&s, "| %d → %d | %s | %s | %s | %d | %d (%d) | %s | %s | %d / %d | %d / %d | %s |\n",
			c.From, c.To, ms(c.ReadyAt.Sub(c.Start)), ms(c.Latency), ms(c.FromDeployment), c.Versions, c.Applies, c.Duplicates,
			ms(c.CPU), mib(c.PeakRSS), c.REST.Reads, c.Audit.Reads, c.REST.Writes, c.Audit.Writes, writesBy(c.Audit.WritesBy))
	}
	fmt.Fprintf(&s, "\nReady → every dispatcher over %d changes: p50 %s ms, p99 %s ms; per dispatcher (%d samples): p50 %s ms, p99 %s ms.\n",
		len(r.Changes), ms(r.P50), ms(r.P99), len(r.Changes)*r.Config.Dispatchers, ms(r.DispatcherP50), ms(r.DispatcherP99))
	fmt.Fprintf(&s, "Controller over the changes: CPU %s ms; RSS peak %s since start, %s at the end; requests: REST %d reads %d writes, audit %d reads %d writes (%s).\n",
		ms(r.CPU), mib(r.HWM), mib(r.RSS), r.REST.Reads, r.REST.Writes, r.Audit.Reads, r.Audit.Writes, writesBy(r.Audit.WritesBy))
	fmt.Fprintf(&s, "%d pods, %d dispatchers, %d TenantQuotas, %d Nodes, cold start %s, controller QPS %s; load average %s before, %s after.\n",
		r.Config.Pods, r.Config.Dispatchers, r.Config.Quotas, r.Config.Nodes, r.Config.ColdStart, qps(r.Config.ControllerQPS), r.LoadBefore, r.LoadAfter)
	s.WriteString("\nTimelines, from each readiness change:\n")
	for _, c := range r.Changes {
		fmt.Fprintf(&s, "- %s\n", c.timeline())
	}
	return s.String()
}

func qps(n int) string {
	if n == 0 {
		return "its default (--kube-api-qps 50, burst 100)"
	}
	return fmt.Sprintf("%d (burst %d)", n, 2*n)
}

func writesBy(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (r result) write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
