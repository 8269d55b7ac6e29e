package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// Files of the report directory.
const (
	reportMarkdown  = "README.md"
	reportJSON      = "summary.json"
	chartWaits      = "queue-wait.png"
	chartRefusals   = "refusals.png"
	chartQueueBound = "queue-and-bounds.png"
)

// summary is summary.json, and what README.md is written from.
type summary struct {
	Interrupted   bool            `json:"interrupted"`
	Error         string          `json:"error,omitempty"`
	StartedAt     time.Time       `json:"startedAt"`
	LoadSeconds   float64         `json:"loadSeconds"`
	GraceSeconds  float64         `json:"graceSeconds"`
	EndedSeconds  float64         `json:"endedSeconds"`
	ServiceTime   string          `json:"serviceTime"`
	Subnet        string          `json:"subnet"`
	Pool          string          `json:"pool"`
	Replicas      int32           `json:"replicas"`
	PerReplica    int             `json:"concurrencyPerReplica"`
	ClientTimeout float64         `json:"clientTimeoutSeconds"`
	Tiers         []tierSummary   `json:"tiers"`
	SteadyTiers   []steadyTier    `json:"steadyTiers"`
	Streams       []streamSummary `json:"streams"`
	Phases        []phaseSummary  `json:"phases"`
	ScaleEvents   []scaleEvent    `json:"scaleEvents"`
	OpenAI        openaiSummary   `json:"openai"`
	// Budget is the tenant over its tokens budget (budget.go).
	Budget     *budgetSummary     `json:"budget,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	Events     []string           `json:"events,omitempty"`
	Processes  int                `json:"processes"`
	// Jobs are the dispatchers' queue totals at the end, once idle: every
	// admitted job ended exactly once if Admitted is the sum of the rest.
	Jobs     queue.Totals `json:"jobs"`
	JobsIdle bool         `json:"jobsIdle"`
	Charts   []string     `json:"charts"`
	// Zero is the scale-from-zero phase after the main load; the rest of
	// the summary is the main load's alone.
	Zero *zeroSummary `json:"zero,omitempty"`
	// Fair is the token-fairness phase, after the scale-from-zero one.
	Fair *fairSummary `json:"fairness,omitempty"`
	// Cluster is what ran around the API server and the pods it made.
	Cluster *clusterSummary `json:"cluster,omitempty"`
}

// tierSummary is one tier, client-side (every HTTP request, openai-go
// attempts included) and server-side (the dispatchers' metrics, summed).
type tierSummary struct {
	Tier           string         `json:"tier"`
	Requests       int            `json:"requests"`
	Served         int            `json:"served"`
	Refused        int            `json:"refused"`
	RefusedByCause map[string]int `json:"refusedByCause"`
	Cut            int            `json:"cut"`
	Errors         int            `json:"errors"`
	Dispatched     int            `json:"dispatched"`
	WaitP50        float64        `json:"waitP50Seconds"`
	WaitP95        float64        `json:"waitP95Seconds"`
	WaitP99        float64        `json:"waitP99Seconds"`
	WaitMax        float64        `json:"waitMaxSeconds"`

	ServerOK             float64            `json:"serverOK"`
	ServerRefusedByCause map[string]float64 `json:"serverRefusedByCause"`
	ServerClientGone     float64            `json:"serverClientGone"`
	ServerWaitP50        float64            `json:"serverWaitP50Seconds"`
	ServerWaitP95        float64            `json:"serverWaitP95Seconds"`
	ServerWaitCount      float64            `json:"serverWaitCount"`

	BoundStart int `json:"boundStart"`
	BoundMin   int `json:"boundMin"`
	BoundEnd   int `json:"boundEnd"`
}

// steadyTier is the waits of one tier's steady streams: tenants that stay
// under their own caps.
type steadyTier struct {
	Tier       string   `json:"tier"`
	Streams    []string `json:"streams"`
	Dispatched int      `json:"dispatched"`
	WaitP50    float64  `json:"waitP50Seconds"`
	WaitP95    float64  `json:"waitP95Seconds"`
}

// streamSummary is one part of the load.
type streamSummary struct {
	Name           string         `json:"name"`
	Role           string         `json:"role"`
	Tier           string         `json:"tier"`
	Requests       int            `json:"requests"`
	Served         int            `json:"served"`
	RefusedByCause map[string]int `json:"refusedByCause"`
	NotSent        int            `json:"notSent"`
	WaitP50        float64        `json:"waitP50Seconds"`
	WaitP95        float64        `json:"waitP95Seconds"`
	// Budgeted: the stream is held back by its tokens budget, not by its
	// caps.
	Budgeted bool `json:"budgeted,omitempty"`
}

// phaseSummary is one tier during one pool size.
type phaseSummary struct {
	Phase          string         `json:"phase"`
	Replicas       int32          `json:"replicas"`
	FromSeconds    float64        `json:"fromSeconds"`
	ToSeconds      float64        `json:"toSeconds"`
	Tier           string         `json:"tier"`
	Dispatched     int            `json:"dispatched"`
	PerSecond      float64        `json:"dispatchedPerSecond"`
	WaitP95        float64        `json:"waitP95Seconds"`
	RefusedByCause map[string]int `json:"refusedByCause"`
}

// openaiSummary is the openai-go client's calls.
type openaiSummary struct {
	Tenant             string  `json:"tenant"`
	Workers            int     `json:"workers"`
	Calls              int     `json:"calls"`
	Succeeded          int     `json:"succeeded"`
	Failed             int     `json:"failed"`
	Cut                int     `json:"cut"`
	Attempts           int     `json:"attempts"`
	RetriesAfterHeader int     `json:"retriesAfterRetryAfter"`
	Honoured           int     `json:"honoured"`
	MinGapRatio        float64 `json:"minGapOverRetryAfter"`
	MaxRetryAfter      int     `json:"maxRetryAfterSeconds"`
	OtherRetries       int     `json:"otherRetries"`
	SucceededAfteRetry int     `json:"succeededAfterRetry"`
}

// summarize turns what was recorded into the summary.
func (d *demo) summarize(runErr error) *summary {
	recs, waits, calls := d.rec.snapshot()
	samples := d.obs.all()
	events := d.scaleEvents()
	order := tierOrder(d.plan)
	s := &summary{
		Interrupted: errors.Is(runErr, errInterrupted), StartedAt: d.started,
		LoadSeconds: d.sched.Load.Seconds(), GraceSeconds: d.sched.Grace.Seconds(), EndedSeconds: d.ended.Seconds(),
		ServiceTime: d.cfg.ServiceTime, Subnet: d.subnet + ".0/24", Pool: d.pool.Namespace + "/" + d.pool.Name,
		Replicas: d.pool.Replicas, PerReplica: d.pool.PerReplica, ClientTimeout: d.pool.ClientTimeout.Seconds(),
		ScaleEvents: events, Processes: d.sup.count(), Cluster: d.clusterSum,
	}
	if runErr != nil && !s.Interrupted {
		s.Error = runErr.Error()
	}
	if d.final != nil {
		s.Conditions, s.Events = d.final.Conditions, d.final.Events
	}
	var last sample
	for i := len(samples) - 1; i >= 0; i-- {
		if samples[i].OK {
			last = samples[i]
			break
		}
	}
	s.Jobs, s.JobsIdle = last.Totals, last.OK && last.Queued == 0 && last.InFlight == 0
	for _, t := range order {
		ts := tierSummary{Tier: t, RefusedByCause: map[string]int{}, ServerRefusedByCause: map[string]float64{}, BoundMin: math.MaxInt}
		for _, r := range recs {
			if r.Tier != t {
				continue
			}
			ts.Requests++
			switch r.Outcome {
			case outcomeServed:
				ts.Served++
			case outcomeRefused:
				ts.Refused++
				ts.RefusedByCause[r.Cause]++
			case outcomeCut:
				ts.Cut++
			default:
				ts.Errors++
			}
		}
		ws := waitsOf(waits, func(w waitSample) bool { return w.Tier == t })
		ts.Dispatched = len(ws)
		ts.WaitP50, ts.WaitP95, ts.WaitP99 = percentile(ws, .5).Seconds(), percentile(ws, .95).Seconds(), percentile(ws, .99).Seconds()
		ts.WaitMax = percentile(ws, 1).Seconds()
		ts.ServerOK = last.Responses[t]["200"]
		ts.ServerClientGone = last.Responses[t]["499"]
		for cause, n := range last.Refused[t] {
			ts.ServerRefusedByCause[cause] = n
		}
		if h := last.Waits[t]; h != nil {
			ts.ServerWaitP50, ts.ServerWaitP95, ts.ServerWaitCount = h.quantile(.5), h.quantile(.95), h.Count
		} else {
			ts.ServerWaitP50, ts.ServerWaitP95 = math.NaN(), math.NaN()
		}
		first := true
		for _, sm := range samples {
			if !sm.OK || sm.T < 0 {
				continue
			}
			b := sm.Tiers[t].Bound
			if first {
				ts.BoundStart, first = b, false
			}
			ts.BoundMin = min(ts.BoundMin, b)
			ts.BoundEnd = b
		}
		if first {
			ts.BoundMin = 0
		}
		s.Tiers = append(s.Tiers, ts)
	}
	for _, t := range order {
		st := steadyTier{Tier: t}
		tenants := map[string]bool{}
		for _, sp := range d.plan {
			if sp.Tier == t && sp.Steady {
				st.Streams = append(st.Streams, sp.Name)
				for _, tn := range sp.Tenants {
					tenants[tn] = true
				}
			}
		}
		ws := waitsOf(waits, func(w waitSample) bool { return w.Tier == t && tenants[w.Tenant] })
		st.Dispatched = len(ws)
		st.WaitP50, st.WaitP95 = percentile(ws, .5).Seconds(), percentile(ws, .95).Seconds()
		s.SteadyTiers = append(s.SteadyTiers, st)
	}
	d.rec.mu.Lock()
	skipped := d.rec.skipped
	for _, st := range d.plan {
		ss := streamSummary{Name: st.Name, Role: st.Role, Tier: st.Tier, RefusedByCause: map[string]int{}, NotSent: skipped[st.Name], Budgeted: st.Budget != nil}
		for _, r := range recs {
			if r.Stream != st.Name {
				continue
			}
			ss.Requests++
			switch r.Outcome {
			case outcomeServed:
				ss.Served++
			case outcomeRefused:
				ss.RefusedByCause[r.Cause]++
			}
		}
		tenants := map[string]bool{}
		for _, t := range st.Tenants {
			tenants[t] = true
		}
		ws := waitsOf(waits, func(w waitSample) bool { return w.Tier == st.Tier && tenants[w.Tenant] })
		ss.WaitP50, ss.WaitP95 = percentile(ws, .5).Seconds(), percentile(ws, .95).Seconds()
		s.Streams = append(s.Streams, ss)
	}
	d.rec.mu.Unlock()
	s.Phases = phases(order, events, d.pool.Replicas, d.sched.Load, recs, waits)
	s.OpenAI = summarizeOpenAI(d.plan, calls)
	s.Budget = summarizeBudget(d.plan, calls, d.budgets)
	s.Zero = d.summarizeZero()
	s.Fair = d.summarizeFair()
	return s
}

func waitsOf(ws []waitSample, keep func(waitSample) bool) []time.Duration {
	var out []time.Duration
	for _, w := range ws {
		if keep(w) {
			out = append(out, w.Wait)
		}
	}
	return out
}

// phases splits the load at the scale events.
func phases(order []string, events []scaleEvent, full int32, load time.Duration, recs []record, waits []waitSample) []phaseSummary {
	type span struct {
		name     string
		replicas int32
		from, to float64
	}
	spans := []span{{name: "before the scale-down", replicas: full, from: 0, to: load.Seconds()}}
	for i, e := range events {
		spans[len(spans)-1].to = e.AtSeconds
		name := fmt.Sprintf("scaled to %d replicas", e.To)
		if i > 0 && e.To == full {
			name = fmt.Sprintf("back at %d replicas", e.To)
		}
		spans = append(spans, span{name: name, replicas: e.To, from: e.AtSeconds, to: load.Seconds()})
	}
	var out []phaseSummary
	for _, sp := range spans {
		for _, t := range order {
			p := phaseSummary{Phase: sp.name, Replicas: sp.replicas, FromSeconds: sp.from, ToSeconds: sp.to, Tier: t, RefusedByCause: map[string]int{}}
			in := func(d time.Duration) bool { return d.Seconds() >= sp.from && d.Seconds() < sp.to }
			ws := waitsOf(waits, func(w waitSample) bool { return w.Tier == t && in(w.Dispatch) })
			p.Dispatched = len(ws)
			if sp.to > sp.from {
				p.PerSecond = float64(len(ws)) / (sp.to - sp.from)
			}
			p.WaitP95 = percentile(ws, .95).Seconds()
			for _, r := range recs {
				if r.Tier == t && r.Outcome == outcomeRefused && in(r.End) {
					p.RefusedByCause[r.Cause]++
				}
			}
			out = append(out, p)
		}
	}
	return out
}

func summarizeOpenAI(plan []streamPlan, calls []openaiCall) openaiSummary {
	var o openaiSummary
	stream := ""
	for _, s := range plan {
		if s.Kind == kindOpenAI && s.Budget == nil {
			o.Tenant, o.Workers, stream = strings.Join(s.Tenants, ","), s.Workers, s.Name
		}
	}
	o.MinGapRatio = math.NaN()
	for _, c := range calls {
		if c.Stream != stream {
			continue // the budget stream's are summarised apart
		}
		o.Calls++
		o.Attempts += len(c.Attempts)
		switch c.Outcome {
		case outcomeServed:
			o.Succeeded++
			if len(c.Attempts) > 1 {
				o.SucceededAfteRetry++
			}
		case outcomeCut:
			o.Cut++
		default:
			o.Failed++
		}
		for i := 1; i < len(c.Attempts); i++ {
			prev, cur := c.Attempts[i-1], c.Attempts[i]
			if prev.RetryAfter <= 0 {
				o.OtherRetries++
				continue
			}
			o.RetriesAfterHeader++
			o.MaxRetryAfter = max(o.MaxRetryAfter, prev.RetryAfter)
			ratio := (cur.Start - prev.End).Seconds() / float64(prev.RetryAfter)
			if ratio >= honouredRatio {
				o.Honoured++
			}
			if math.IsNaN(o.MinGapRatio) || ratio < o.MinGapRatio {
				o.MinGapRatio = ratio
			}
		}
	}
	return o
}

// writeReport writes summary.json, the charts and README.md.
func (d *demo) writeReport(runErr error) error {
	s := d.summarize(runErr)
	dir := d.cfg.Report
	recs, waits, _ := d.rec.snapshot()
	charts := []struct {
		file string
		draw func(string) error
	}{
		{chartWaits, func(p string) error { return drawWaits(p, s, waits) }},
		{chartRefusals, func(p string) error { return drawRefusals(p, s, recs) }},
		{chartQueueBound, func(p string) error { return drawQueues(p, s, d.obs.all(), tierOrder(d.plan)) }},
	}
	if s.Zero != nil {
		zrecs, zwaits, _ := d.zero.rec.snapshot()
		charts = append(charts, struct {
			file string
			draw func(string) error
		}{chartZero, func(p string) error {
			return drawZero(p, s.Zero, d.zero.obs.all(), zrecs, zwaits, tierOrder(d.zero.plan))
		}})
	}
	if s.Fair != nil {
		fcalls, sims := d.fair.snapshot()
		charts = append(charts, struct {
			file string
			draw func(string) error
		}{chartFair, func(p string) error { return drawFair(p, s.Fair, fcalls, sims, d.fair.obs.all(), d.fair.weights) }})
	}
	var errs []error
	for _, c := range charts {
		if err := c.draw(filepath.Join(dir, c.file)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.file, err))
			continue
		}
		s.Charts = append(s.Charts, c.file)
	}
	b, err := json.MarshalIndent(jsonSafe(s), "", "  ")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := os.WriteFile(filepath.Join(dir, reportJSON), append(b, '\n'), 0o644); err != nil {
		errs = append(errs, err)
	}
	var getOut string
	if d.final != nil {
		getOut = d.final.Get
	}
	if err := os.WriteFile(filepath.Join(dir, reportMarkdown), []byte(markdown(s, getOut)), 0o644); err != nil {
		errs = append(errs, err)
	}
	d.ui.logf("report written to %s (README.md, summary.json, %s)", dir, strings.Join(s.Charts, ", "))
	for _, t := range s.Tiers {
		d.ui.logf("  %-8s requests %5d  served %5d  refused %5d %v  wait p50 %.1fs p95 %.1fs", t.Tier, t.Requests, t.Served, t.Refused, causes(t.RefusedByCause), t.WaitP50, t.WaitP95)
	}
	if z := s.Zero; z != nil {
		d.ui.logf("scale from zero (cold start %s): held %d, served after the cold start %d, refused at once %d; desiredReplicas reached %d",
			secondsD(z.ColdStartSeconds), z.Held, z.Served, z.Refused, z.DesiredReplicas)
		for _, t := range z.Tiers {
			d.ui.logf("  %-8s %s", t.Tier, zeroTierWords(t, z.ColdStartSeconds))
		}
	}
	if f := s.Fair; f != nil {
		d.ui.logf("token fairness in tier %s (%d of %d requests answered 200; fairness gap at most %.0f, bound %.0f):", f.Tier, f.OK, f.Requests, f.GapMax, f.GapBound)
		for _, m := range f.Modes {
			var parts []string
			for _, t := range m.Tenants {
				parts = append(parts, fmt.Sprintf("%s %.1f%% of the weighted tokens (%d requests, wait p50 %.1fs p99 %.1fs)", t.Tenant, 100*t.Share, t.Requests, t.WaitP50, t.WaitP99))
			}
			d.ui.logf("  %-8s jainTokens %.3f: %s", m.Mode, m.JainTokens, strings.Join(parts, "; "))
		}
	}
	return errors.Join(errs...)
}

// jsonSafe replaces NaN (which JSON cannot carry) with -1 in a copy.
func jsonSafe(s *summary) *summary {
	c := *s
	c.Tiers = append([]tierSummary(nil), s.Tiers...)
	for i := range c.Tiers {
		for _, f := range []*float64{&c.Tiers[i].ServerWaitP50, &c.Tiers[i].ServerWaitP95} {
			if math.IsNaN(*f) {
				*f = -1
			}
		}
	}
	if math.IsNaN(c.OpenAI.MinGapRatio) {
		c.OpenAI.MinGapRatio = -1
	}
	return &c
}

// causes formats counts by cause, sorted by cause.
func causes(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func causesF(m map[string]float64) string {
	im := map[string]int{}
	for k, v := range m {
		if v > 0 {
			im[k] = int(math.Round(v))
		}
	}
	return causes(im)
}
