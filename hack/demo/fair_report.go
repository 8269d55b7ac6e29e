package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// chartFair is the token-fairness phase's chart.
const chartFair = "token-fairness.png"

// fairSummary is the token-fairness phase in summary.json. Times are
// seconds since the phase's load started.
type fairSummary struct {
	Tier             string           `json:"tier"`
	ShareCommand     string           `json:"shareCommand"`
	SwitchCommand    string           `json:"switchCommand"`
	InputWeight      int              `json:"inputWeight"`
	OutputWeight     int              `json:"outputWeight"`
	Prefill          int              `json:"prefillTokensPerSecond"`
	Decode           int              `json:"decodeTokensPerSecond"`
	MaxTokens        int              `json:"maxTokens"`
	WorkersPerTenant int              `json:"workersPerTenant"`
	Tenants          []fairTenantPlan `json:"tenants"`
	ModeSeconds      float64          `json:"modeSeconds"`
	PatchedAt        float64          `json:"patchedAtSeconds"`
	SwitchedAt       float64          `json:"switchedAtSeconds"` // 0: not every dispatcher switched
	LoadEnd          float64          `json:"loadEndSeconds"`
	Ended            float64          `json:"endedSeconds"`
	Dispatchers      int              `json:"dispatchers"`
	Switched         int              `json:"switchedDispatchers"`
	// Requests are every request of the phase; OK those answered 200 with
	// their whole answer; NotOK the rest by "status cause".
	Requests int            `json:"requests"`
	OK       int            `json:"ok"`
	NotOK    map[string]int `json:"notOK"`
	Modes    []fairMode     `json:"modes"`
	// GapMax is the largest tiergate_fairness_gap_tokens sampled (any
	// dispatcher); GapBound the bound the mode promises for tenants
	// backlogged together from the switch on, the largest request's cost
	// ÷ weight as charged at dispatch, its reservation
	// (docs/scheduling.md); GapBoundMetric the largest
	// tiergate_fairness_gap_bound_tokens sampled. BytesPerToken is the
	// smallest ratio the dispatchers estimated prompts at in the phase.
	GapMax         float64 `json:"gapMax"`
	GapBound       float64 `json:"gapBound"`
	GapBoundMetric float64 `json:"gapBoundMetric"`
	GapSamples     int     `json:"gapSamples"`
	BytesPerToken  float64 `json:"bytesPerToken"`
	// Served are the tokens the simservers counted per tenant over the
	// phase, Usage the sum of the answers' usage.
	Served map[string]simTokens `json:"servedBySimservers"`
	Usage  map[string]simTokens `json:"usageOfAnswers"`
	Jobs   jobsSummary          `json:"jobs"`
}

// fairTenantPlan is what one tenant sends.
type fairTenantPlan struct {
	Tenant       string `json:"tenant"`
	Role         string `json:"role"`
	PromptTokens int64  `json:"promptTokens"`
	Cost         int64  `json:"cost"` // weighted tokens of one request
	// Reserved is the most one request reserves: its prompt estimated at
	// the phase's smallest bytes-per-token ratio, and max_tokens.
	Reserved       int64   `json:"reserved"`
	ServiceSeconds float64 `json:"serviceSeconds"`
}

// fairMode is one mode's window: the requests dispatched in it.
type fairMode struct {
	Mode        string           `json:"mode"`
	FromSeconds float64          `json:"fromSeconds"`
	ToSeconds   float64          `json:"toSeconds"`
	JainTokens  float64          `json:"jainTokens"`
	Tenants     []fairModeTenant `json:"tenants"`
}

type fairModeTenant struct {
	Tenant           string  `json:"tenant"`
	Requests         int     `json:"requests"`
	PromptTokens     int64   `json:"promptTokens"`
	CompletionTokens int64   `json:"completionTokens"`
	WeightedTokens   float64 `json:"weightedTokens"`
	Share            float64 `json:"share"`
	WaitP50          float64 `json:"waitP50Seconds"`
	WaitP99          float64 `json:"waitP99Seconds"`
}

// weighted is a tenant's weighted tokens under f's weights (every tenant
// of the phase has weight 1).
func weighted(f policy.Fairness, t simTokens) float64 {
	return float64(f.Cost(t.Prompt, t.Completion))
}

// jain is Jain's index of xs: 1 when all are equal, 1/n when one has all.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func lastSim(sims []simSample) (simSample, bool) {
	for i := len(sims) - 1; i >= 0; i-- {
		if sims[i].OK {
			return sims[i], true
		}
	}
	return simSample{}, false
}

// summarizeFair is the phase's summary; nil when its load never began.
func (d *demo) summarizeFair() *fairSummary {
	f := d.fair
	if f == nil || f.rec == nil {
		return nil
	}
	calls, sims := f.snapshot()
	return summarizeFairRun(f, calls, sims, f.obs.all(), len(d.disps))
}

// summarizeFairRun is summarizeFair on what was recorded.
func summarizeFairRun(f *fairRun, calls []fairCall, sims []simSample, samples []sample, dispatchers int) *fairSummary {
	w := f.weights
	s := &fairSummary{
		Tier: fairTier, ShareCommand: f.shareCommand, SwitchCommand: f.switchCommand, InputWeight: w.InputWeight, OutputWeight: w.OutputWeight,
		Prefill: fairPrefill, Decode: fairDecode, MaxTokens: fairMaxTokens, WorkersPerTenant: fairWorkers,
		ModeSeconds: f.sched.Mode.Seconds(), PatchedAt: f.patchedAt.Seconds(), SwitchedAt: f.switchedAt.Seconds(),
		LoadEnd: f.loadEnd.Seconds(), Ended: f.ended.Seconds(), Dispatchers: dispatchers, Switched: f.switched,
		NotOK: map[string]int{}, Served: map[string]simTokens{}, Usage: map[string]simTokens{},
	}
	for _, sm := range samples {
		if sm.OK && sm.BytesPerToken > 0 && (s.BytesPerToken == 0 || sm.BytesPerToken < s.BytesPerToken) {
			s.BytesPerToken = sm.BytesPerToken
		}
	}
	ratio := s.BytesPerToken
	if ratio == 0 {
		ratio = tokens.DefaultBytesPerToken
	}
	var names []string
	for _, t := range f.tenants {
		names = append(names, t.Name)
		cost := w.Cost(t.promptTokens(), fairMaxTokens)
		reserved := w.Cost(int64(math.Ceil(float64(t.PromptBytes)/ratio)), fairMaxTokens)
		s.Tenants = append(s.Tenants, fairTenantPlan{Tenant: t.Name, Role: t.Role, PromptTokens: t.promptTokens(), Cost: cost, Reserved: reserved, ServiceSeconds: t.serviceTime().Seconds()})
		s.GapBound = math.Max(s.GapBound, float64(reserved))
	}
	for _, c := range calls {
		s.Requests++
		if c.Outcome == outcomeServed && c.Status == 200 {
			s.OK++
		} else {
			s.NotOK[fmt.Sprintf("%d %s", c.Status, c.Cause)]++
		}
		u := s.Usage[c.Tenant]
		u.Prompt += c.PromptTokens
		u.Completion += c.CompletionTokens
		s.Usage[c.Tenant] = u
	}
	if last, ok := lastSim(sims); ok {
		s.Served = last.Tenants
	}
	s.Modes = append(s.Modes, fairWindow(policy.FairnessRequests, 0, f.patchedAt, names, calls, w))
	if f.switchedAt > 0 {
		s.Modes = append(s.Modes, fairWindow(policy.FairnessTokens, f.switchedAt, f.loadEnd, names, calls, w))
	}
	for _, sm := range samples {
		if !sm.OK || sm.T < 0 {
			continue
		}
		if g, ok := sm.FairGap[fairTier]; ok {
			s.GapSamples++
			s.GapMax = math.Max(s.GapMax, g)
		}
		s.GapBoundMetric = math.Max(s.GapBoundMetric, sm.FairGapBound[fairTier])
	}
	s.Jobs = phaseJobs(samples)
	return s
}

// fairWindow sums the requests dispatched in [from, to) per tenant: what
// the mode chose while both tenants were kept backlogged.
func fairWindow(mode string, from, to time.Duration, tenants []string, calls []fairCall, w policy.Fairness) fairMode {
	m := fairMode{Mode: mode, FromSeconds: from.Seconds(), ToSeconds: to.Seconds()}
	var total float64
	var xs []float64
	for _, t := range tenants {
		mt := fairModeTenant{Tenant: t}
		var waits []time.Duration
		for _, c := range calls {
			if c.Tenant != t || c.Outcome != outcomeServed || c.Wait < 0 {
				continue
			}
			if at := c.Start + c.Wait; at < from || at >= to {
				continue
			}
			mt.Requests++
			mt.PromptTokens += c.PromptTokens
			mt.CompletionTokens += c.CompletionTokens
			waits = append(waits, c.Wait)
		}
		mt.WeightedTokens = weighted(w, simTokens{Prompt: mt.PromptTokens, Completion: mt.CompletionTokens})
		mt.WaitP50, mt.WaitP99 = percentile(waits, .5).Seconds(), percentile(waits, .99).Seconds()
		total += mt.WeightedTokens
		xs = append(xs, mt.WeightedTokens)
		m.Tenants = append(m.Tenants, mt)
	}
	for i := range m.Tenants {
		if total > 0 {
			m.Tenants[i].Share = m.Tenants[i].WeightedTokens / total
		}
	}
	m.JainTokens = jain(xs)
	return m
}

// drawFair is the phase's chart: above, the weighted tokens served each
// tenant, cumulative, as the simservers counted them when each answer
// ended and (dashed) by when each request was dispatched; below, the
// dispatchers' fairness gap against its bound. Both mark the mode switch.
func drawFair(file string, s *fairSummary, calls []fairCall, sims []simSample, samples []sample, w policy.Fairness) error {
	top, err := fairTokensPlot(s, calls, sims, w)
	if err != nil {
		return err
	}
	bottom, err := fairGapPlot(s, samples)
	if err != nil {
		return err
	}
	end := math.Max(s.LoadEnd, s.Ended)
	for _, p := range []*plot.Plot{top, bottom} {
		p.X.Min, p.X.Max, p.Y.Min = 0, end, 0
		if p.Y.Max <= 0 || math.IsInf(p.Y.Max, 0) || math.IsNaN(p.Y.Max) {
			p.Y.Max = 1
		}
		p.Y.Max *= 1.4 // room for the legend
		if err := fairMarks(p, s); err != nil {
			return err
		}
	}
	img := vgimg.New(chartWidth, 2*chartHeight)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(12), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, draw.New(img))
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func fairTokensPlot(s *fairSummary, calls []fairCall, sims []simSample, w policy.Fairness) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Two tenants of tier %s: weighted tokens served (prompt × %d + output × %d), cumulative, from the simservers", s.Tier, s.InputWeight, s.OutputWeight)
	p.X.Label.Text = "seconds since the phase's load started"
	p.Y.Label.Text = "weighted tokens"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for i, t := range s.Tenants {
		var xy plotter.XYs
		for _, sm := range sims {
			if sm.OK {
				xy = append(xy, plotter.XY{X: sm.T.Seconds(), Y: weighted(w, sm.Tenants[t.Tenant])})
			}
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = plotutil.Color(i), vg.Points(2.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%s, %d weighted tokens a request), served", t.Tenant, t.Role, t.Cost), l)
		if xy := dispatchedTokens(t.Tenant, calls, w); len(xy) > 0 {
			dl, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			dl.Color, dl.Width, dl.Dashes = plotutil.Color(i), vg.Points(1.5), dashed
			p.Add(dl)
			p.Legend.Add(t.Tenant+", by dispatch time (answers' usage)", dl)
		}
	}
	return p, nil
}

// dispatchedTokens is a tenant's weighted tokens, cumulative, by when its
// answered requests got their slot: what the queue chose, without the
// service time's delay.
func dispatchedTokens(tenant string, calls []fairCall, w policy.Fairness) plotter.XYs {
	var cs []fairCall
	for _, c := range calls {
		if c.Tenant == tenant && c.Outcome == outcomeServed && c.Wait >= 0 {
			cs = append(cs, c)
		}
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].Start+cs[i].Wait < cs[j].Start+cs[j].Wait })
	xy := plotter.XYs{{X: 0, Y: 0}}
	total := 0.0
	for _, c := range cs {
		at := (c.Start + c.Wait).Seconds()
		xy = append(xy, plotter.XY{X: at, Y: total})
		total += weighted(w, simTokens{Prompt: c.PromptTokens, Completion: c.CompletionTokens})
		xy = append(xy, plotter.XY{X: at, Y: total})
	}
	if len(cs) == 0 {
		return nil
	}
	return xy
}

func fairGapPlot(s *fairSummary, samples []sample) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "tiergate_fairness_gap_tokens (largest over the dispatchers) and the bound Tokens mode promises"
	p.X.Label.Text = "seconds since the phase's load started"
	p.Y.Label.Text = "weighted tokens"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	var xy plotter.XYs
	for _, sm := range samples {
		if g, ok := sm.FairGap[s.Tier]; ok && sm.OK && sm.T >= 0 {
			xy = append(xy, plotter.XY{X: sm.T.Seconds(), Y: g})
		}
	}
	if len(xy) > 0 {
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = plotutil.Color(2), vg.Points(2)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("fairness gap (max %.0f)", s.GapMax), l)
	}
	b, err := plotter.NewLine(plotter.XYs{{X: 0, Y: s.GapBound}, {X: math.Max(s.LoadEnd, s.Ended), Y: s.GapBound}})
	if err != nil {
		return nil, err
	}
	b.Color, b.Width, b.Dashes = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, vg.Points(1.5), dashed
	p.Add(b)
	p.Legend.Add(fmt.Sprintf("bound: the largest reservation, %.0f", s.GapBound), b)
	return p, nil
}

// fairMarks draws the patch, the switch and the end of the load.
func fairMarks(p *plot.Plot, s *fairSummary) error {
	marks := []struct {
		at     float64
		label  string
		dashes []vg.Length
	}{
		{s.PatchedAt, fmt.Sprintf("kubectl patch: fairness Tokens (%s)", secondsD(s.PatchedAt)), dotted},
		{s.SwitchedAt, fmt.Sprintf("every dispatcher holds Tokens (%s)", secondsD(s.SwitchedAt)), dashDot},
		{s.LoadEnd, fmt.Sprintf("load stops (%s)", secondsD(s.LoadEnd)), dashed},
	}
	for _, m := range marks {
		if m.at <= 0 {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: m.at, Y: 0}, {X: m.at, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color, l.Width, l.Dashes = color.Gray{Y: 0x40}, vg.Points(1.5), m.dashes
		p.Add(l)
		p.Legend.Add(m.label, l)
	}
	return nil
}

// fairMarkdown is the report's section on the phase.
func fairMarkdown(s *fairSummary) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("\n## Token fairness within a tier\n\n")
	w("Last, two tenants of tier %s, each with %d closed-loop openai-go workers (no retries) and max_tokens %d, kept the tier backlogged: ", s.Tier, s.WorkersPerTenant, s.MaxTokens)
	for i, t := range s.Tenants {
		if i > 0 {
			w(" and ")
		}
		w("**%s** (%s: a request costs %d weighted tokens and holds a slot %s)", t.Tenant, t.Role, t.Cost, secondsD(t.ServiceSeconds))
	}
	w(". Each request asked simserver for a service time of prompt ÷ %d + output ÷ %d tokens a second (`X-Sim-Service-Time`), so a slot serves %d weighted tokens a second whatever the mix. ", s.Prefill, s.Decode, s.Prefill)
	w("First the tier's tenantShare went to 1, so that one tenant may queue the tier's whole bound (`%s`).\n\n", s.ShareCommand)
	if s.SwitchedAt > 0 {
		w("After %s of the load in Requests mode the pool was switched with `%s`; %d of %d dispatchers held Tokens %s later, and the same load ran %s more. ",
			secondsD(s.PatchedAt), s.SwitchCommand, s.Switched, s.Dispatchers, secondsD(s.SwitchedAt-s.PatchedAt), secondsD(s.ModeSeconds))
	} else {
		w("The switch to Tokens mode did **not** reach every dispatcher (%d of %d). ", s.Switched, s.Dispatchers)
	}
	w("Each mode counts the requests dispatched in its window (arrival + `X-Queue-Wait-Ms`), with the tokens of their answers' usage; times are since the phase's load started.\n\n")
	w("| mode | window | jainTokens | tenant | requests | prompt tokens | output tokens | weighted tokens | share | wait p50 | wait p99 |\n")
	w("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, m := range s.Modes {
		for _, t := range m.Tenants {
			w("| %s | %s–%s | %.3f | %s | %d | %d | %d | %.0f | %.1f%% | %s | %s |\n", m.Mode, secondsD(m.FromSeconds), secondsD(m.ToSeconds), m.JainTokens,
				t.Tenant, t.Requests, t.PromptTokens, t.CompletionTokens, t.WeightedTokens, 100*t.Share, fmtSecondsN(t.WaitP50, t.Requests), fmtSecondsN(t.WaitP99, t.Requests))
		}
	}
	w("\n- **Answers:** %d of %d requests were answered 200", s.OK, s.Requests)
	if len(s.NotOK) > 0 {
		w("; the rest: %s", causes(s.NotOK))
	}
	w(".\n- **Fairness gap:** the largest `tiergate_fairness_gap_tokens` of %d samples was %.0f weighted tokens, against the bound of %.0f, the largest cost charged at dispatch: the counters start from zero at the switch with both tenants backlogged, and a request is charged its reservation, its prompt estimated at the dispatchers' learned %.3f bytes a token (settled to its usage when it ends)", s.GapSamples, s.GapMax, s.GapBound, s.BytesPerToken)
	if s.GapBoundMetric > 0 {
		w("; the dispatchers' `tiergate_fairness_gap_bound_tokens` said %.0f", s.GapBoundMetric)
	} else {
		w("; the dispatchers' `tiergate_fairness_gap_bound_tokens` read 0")
	}
	w(".\n- **Tokens served:** ")
	for i, t := range s.Tenants {
		if i > 0 {
			w("; ")
		}
		sv, u := s.Served[t.Tenant], s.Usage[t.Tenant]
		w("%s %d prompt + %d output by the simservers' count, %d + %d in the answers' usage", t.Tenant, sv.Prompt, sv.Completion, u.Prompt, u.Completion)
	}
	j := s.Jobs
	w(".\n- **Queues:** the dispatchers admitted %d requests: %d dispatched, %d abandoned, %d expired, %d drained.\n", j.Admitted, j.Dispatched, j.Abandoned, j.Expired, j.Drained)
	w("\n![Weighted tokens served per tenant and the fairness gap](%s)\n", chartFair)
	return b.String()
}
