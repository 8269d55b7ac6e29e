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
)

// chartZero is the scale-from-zero phase's chart.
const chartZero = "scale-from-zero.png"

// heldMargin is left out at the end of the held period when requests are
// counted as sent while held (see summarizeZero).
const heldMargin = 300 * time.Millisecond

// zeroSummary is the scale-from-zero phase in summary.json. Times are
// seconds since the phase's load started.
type zeroSummary struct {
	ColdStartSeconds float64 `json:"coldStartSeconds"`
	Command          string  `json:"command"`
	LoadSeconds      float64 `json:"loadSeconds"`
	EndedSeconds     float64 `json:"endedSeconds"`
	ZeroAtSeconds    float64 `json:"zeroAtSeconds"`
	UpAtSeconds      float64 `json:"upAtSeconds"`
	FirstAtSeconds   float64 `json:"firstReplicaAtSeconds"`
	BackAtSeconds    float64 `json:"backAtSeconds"`
	// HeldFrom and HeldTo are when the dispatchers held 0 slots: from the
	// policy at zero to the first replica's policy.
	HeldFromSeconds float64 `json:"heldFromSeconds"`
	HeldToSeconds   float64 `json:"heldToSeconds"`
	// PeakHeld is the most requests the dispatchers held at once.
	PeakHeld int `json:"peakHeld"`
	// DesiredReplicas is the highest status.desiredReplicas while held.
	DesiredReplicas int32        `json:"desiredReplicas"`
	Held            int          `json:"held"`
	Served          int          `json:"served"`
	Refused         int          `json:"refused"`
	Tiers           []zeroTier   `json:"tiers"`
	ScaleEvents     []scaleEvent `json:"scaleEvents"`
	ServiceTiers    string       `json:"serviceTiersAtZero,omitempty"`
	Jobs            jobsSummary  `json:"jobs"`
}

// jobsSummary is the dispatchers' queue totals over the phase.
type jobsSummary struct {
	Admitted, Dispatched, Abandoned, Expired, Drained uint64
	Idle                                              bool
}

// zeroTier is one tier's requests sent while the pool held (at 0 slots).
type zeroTier struct {
	Tier string `json:"tier"`
	// BoundAtZero and MaxWaitAtZero are the ServiceTier status at zero
	// (MaxWaitAtZero -1: no wait is promised, the tier is refused).
	BoundAtZero   int     `json:"boundAtZero"`
	MaxWaitAtZero float64 `json:"maxWaitAtZeroSeconds"`
	Sent          int     `json:"sent"`
	// Held were admitted and waited for a slot; Served of them got their
	// answer after the first replica came; Expired got 504.
	Held    int `json:"held"`
	Served  int `json:"served"`
	Expired int `json:"expired"`
	// Refused got an answer at once: 503 unavailable (the tier cannot wait
	// out the cold start) or 429 (its bound at zero was full).
	Refused        int            `json:"refused"`
	RefusedByCause map[string]int `json:"refusedByCause"`
	RetryAfter     int            `json:"retryAfterSeconds"` // the largest on a 503
	PeakHeld       int            `json:"peakHeld"`
	// Waits of the held requests that were served (X-Queue-Wait-Ms), and
	// the longest time any of them had to wait for the first replica's
	// policy (HeldTo − its arrival).
	WaitMin       float64 `json:"waitMinSeconds"`
	WaitP50       float64 `json:"waitP50Seconds"`
	WaitMax       float64 `json:"waitMaxSeconds"`
	UntilReplica  float64 `json:"untilReplicaMaxSeconds"`
	WithinMaxWait bool    `json:"withinMaxWait"`
}

// summarizeZero turns the phase's records into its summary; nil when the
// phase did not run.
func (d *demo) summarizeZero() *zeroSummary {
	z := d.zero
	if z == nil || z.rec == nil {
		return nil
	}
	recs, waits, _ := z.rec.snapshot()
	samples := z.obs.all()
	s := &zeroSummary{
		ColdStartSeconds: zeroColdStart.Seconds(), Command: z.command, LoadSeconds: z.sched.Load.Seconds(), EndedSeconds: z.ended.Seconds(),
		ZeroAtSeconds: z.sched.ZeroAt.Seconds(), UpAtSeconds: z.sched.UpAt.Seconds(), FirstAtSeconds: z.sched.FirstAt.Seconds(), BackAtSeconds: z.sched.BackAt.Seconds(),
		DesiredReplicas: z.desired, ServiceTiers: z.tiersAtZero,
	}
	d.mu.Lock()
	for _, e := range z.events {
		s.ScaleEvents = append(s.ScaleEvents, *e)
	}
	d.mu.Unlock()
	if len(s.ScaleEvents) >= 2 {
		s.HeldFromSeconds = s.ScaleEvents[0].AtSeconds + s.ScaleEvents[0].FollowedAfterSeconds
		s.HeldToSeconds = s.ScaleEvents[1].AtSeconds + s.ScaleEvents[1].FollowedAfterSeconds
	}
	// HeldTo is when the demo saw the first replica's policy, polled, so
	// up to a poll later than it came: a request sent just before may have
	// been dispatched at once. Those of the last heldMargin do not count.
	held := func(t time.Duration) bool {
		return t.Seconds() >= s.HeldFromSeconds && t.Seconds() < s.HeldToSeconds-heldMargin.Seconds()
	}
	for _, sm := range samples {
		if sm.OK && held(sm.T) {
			s.PeakHeld = max(s.PeakHeld, sm.Queued)
		}
	}
	s.Jobs = phaseJobs(samples)
	for _, t := range tierOrder(z.plan) {
		zt := summarizeZeroTier(t, recs, waits, samples, held, s.HeldToSeconds)
		if st, ok := z.atZero[t]; ok {
			zt.BoundAtZero, zt.MaxWaitAtZero = int(st.QueueBound), -1
			if st.MaxWait != nil {
				zt.MaxWaitAtZero = st.MaxWait.Seconds()
			}
		}
		zt.WithinMaxWait = zt.Served == 0 || (zt.MaxWaitAtZero > 0 && zt.WaitMax <= zt.MaxWaitAtZero)
		s.Held += zt.Held
		s.Served += zt.Served
		s.Refused += zt.Refused
		s.Tiers = append(s.Tiers, zt)
	}
	return s
}

// summarizeZeroTier counts one tier's requests sent while held.
func summarizeZeroTier(t string, recs []record, waits []waitSample, samples []sample, held func(time.Duration) bool, heldTo float64) zeroTier {
	zt := zeroTier{Tier: t, RefusedByCause: map[string]int{}}
	for _, r := range recs {
		if r.Tier != t || !held(r.Start) {
			continue
		}
		zt.Sent++
		switch {
		case r.Outcome == outcomeRefused && r.Cause == "queue_timeout":
			zt.Held++
			zt.Expired++
		case r.Outcome == outcomeRefused:
			zt.Refused++
			zt.RefusedByCause[r.Cause]++
			if r.Cause == "unavailable" {
				zt.RetryAfter = max(zt.RetryAfter, r.RetryAfter)
			}
		case r.Outcome == outcomeServed:
			zt.Held++
			zt.Served++
		default:
			zt.Held++ // cut or failed while held
		}
	}
	var ws []time.Duration
	for _, w := range waits {
		if start := w.Dispatch - w.Wait; w.Tier == t && held(start) {
			ws = append(ws, w.Wait)
			zt.UntilReplica = math.Max(zt.UntilReplica, heldTo-start.Seconds())
		}
	}
	if len(ws) > 0 {
		zt.WaitMin, zt.WaitP50, zt.WaitMax = percentile(ws, 0).Seconds(), percentile(ws, .5).Seconds(), percentile(ws, 1).Seconds()
	}
	for _, sm := range samples {
		if sm.OK && held(sm.T) {
			zt.PeakHeld = max(zt.PeakHeld, sm.Tiers[t].Queued)
		}
	}
	return zt
}

// phaseJobs is the dispatchers' queue totals over the phase: the last
// sample's less the first's.
func phaseJobs(samples []sample) jobsSummary {
	var first, last *sample
	for i := range samples {
		if samples[i].OK {
			if first == nil {
				first = &samples[i]
			}
			last = &samples[i]
		}
	}
	if first == nil {
		return jobsSummary{}
	}
	f, l := first.Totals, last.Totals
	return jobsSummary{Admitted: l.Admitted - f.Admitted, Dispatched: l.Dispatched - f.Dispatched, Abandoned: l.Abandoned - f.Abandoned,
		Expired: l.Expired - f.Expired, Drained: l.Drained - f.Drained, Idle: last.Queued == 0 && last.InFlight == 0}
}

// drawZero is the phase's chart: above, what the dispatchers held per
// tier and the 503s of the tier that cannot wait, over the phase; below,
// each held request's wait against the time it had to wait for the first
// replica.
func drawZero(file string, z *zeroSummary, samples []sample, recs []record, waits []waitSample, order []string) error {
	top, err := zeroHeldPlot(z, samples, recs, order)
	if err != nil {
		return err
	}
	bottom, err := zeroWaitPlot(z, waits, order)
	if err != nil {
		return err
	}
	end := math.Max(z.LoadSeconds, z.EndedSeconds)
	every := math.Max(1, math.Round(end/25))
	var ticks []plot.Tick
	for x := 0.0; x <= end; x += every {
		label := ""
		if int(x)%int(5*every) == 0 {
			label = fmt.Sprintf("%.0f", x)
		}
		ticks = append(ticks, plot.Tick{Value: x, Label: label})
	}
	for _, p := range []*plot.Plot{top, bottom} {
		p.X.Min, p.X.Max = 0, end
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Y.Min = 0
		if p.Y.Max <= 0 || math.IsInf(p.Y.Max, 0) || math.IsNaN(p.Y.Max) {
			p.Y.Max = 1
		}
		p.Y.Max *= 1.5 // room for the legend
		if err := zeroMarks(p, z); err != nil {
			return err
		}
	}
	img := vgimg.New(chartWidth, 2*chartHeight)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(12), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func zeroHeldPlot(z *zeroSummary, samples []sample, recs []record, order []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Scale from zero: requests held per tier (dispatchers' queues) and immediate 503s (cold start %s)", secondsD(z.ColdStartSeconds))
	p.X.Label.Text = "seconds since the phase's load started"
	p.Y.Label.Text = "requests"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for i, t := range order {
		var q plotter.XYs
		for _, sm := range samples {
			if sm.OK && sm.T >= 0 {
				q = append(q, plotter.XY{X: sm.T.Seconds(), Y: float64(sm.Tiers[t].Queued)})
			}
		}
		if len(q) == 0 {
			continue
		}
		l, err := plotter.NewLine(q)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = plotutil.Color(i), vg.Points(2)
		p.Add(l)
		p.Legend.Add(t+" queued or held", l)
	}
	var ends []float64
	for _, r := range recs {
		if r.Outcome == outcomeRefused && r.Cause == "unavailable" {
			ends = append(ends, r.End.Seconds())
		}
	}
	sort.Float64s(ends)
	if len(ends) > 0 {
		step := plotter.XYs{{X: 0, Y: 0}}
		for i, e := range ends {
			step = append(step, plotter.XY{X: e, Y: float64(i)}, plotter.XY{X: e, Y: float64(i + 1)})
		}
		step = append(step, plotter.XY{X: math.Max(z.LoadSeconds, z.EndedSeconds), Y: float64(len(ends))})
		l, err := plotter.NewLine(step)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.Dashes = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, vg.Points(2), dashed
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("503 unavailable, refused at once (cumulative, %d)", len(ends)), l)
	}
	return p, nil
}

func zeroWaitPlot(z *zeroSummary, waits []waitSample, order []string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Wait of each request held at zero (X-Queue-Wait-Ms), by arrival"
	p.X.Label.Text = "arrival, seconds since the phase's load started"
	p.Y.Label.Text = "wait (seconds)"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for i, t := range order {
		var xy plotter.XYs
		for _, w := range waits {
			start := (w.Dispatch - w.Wait).Seconds()
			if w.Tier == t && start >= z.HeldFromSeconds && start < z.HeldToSeconds {
				xy = append(xy, plotter.XY{X: start, Y: w.Wait.Seconds()})
			}
		}
		if len(xy) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(xy)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Radius = plotutil.Color(i), vg.Points(3.5)
		sc.Shape = plotutil.Shape(i)
		p.Add(sc)
		label := t + " held"
		for _, zt := range z.Tiers {
			if zt.Tier == t && zt.MaxWaitAtZero > 0 {
				label += fmt.Sprintf(" (maxWait at zero %s)", secondsD(zt.MaxWaitAtZero))
			}
		}
		p.Legend.Add(label, sc)
	}
	if z.HeldToSeconds > z.HeldFromSeconds {
		floor, err := plotter.NewLine(plotter.XYs{{X: z.HeldFromSeconds, Y: z.HeldToSeconds - z.HeldFromSeconds}, {X: z.HeldToSeconds, Y: 0}})
		if err != nil {
			return nil, err
		}
		floor.Color, floor.Width, floor.Dashes = color.Gray{Y: 0x30}, vg.Points(1.5), dashed
		p.Add(floor)
		p.Legend.Add("time until the first replica's policy", floor)
	}
	return p, nil
}

// zeroMarks draws the phase's scale events.
func zeroMarks(p *plot.Plot, z *zeroSummary) error {
	names := []string{"pool scaled to 0", "first replica Ready", "pool back at 6"}
	for i, e := range z.ScaleEvents {
		l, err := plotter.NewLine(plotter.XYs{{X: e.AtSeconds, Y: 0}, {X: e.AtSeconds, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color, l.Width, l.Dashes = color.Gray{Y: 0x40}, vg.Points(1.5), [][]vg.Length{dotted, dashDot, dashDot}[min(i, 2)]
		p.Add(l)
		if i < len(names) {
			p.Legend.Add(fmt.Sprintf("%s (%s)", names[i], secondsD(e.AtSeconds)), l)
		}
	}
	return nil
}

// zeroMarkdown is the report's section on the phase.
func zeroMarkdown(z *zeroSummary) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("\n## Scale from zero and back\n\n")
	w("After the main load the demo gave the pool a cold start (`%s`) and offered a lighter load for %s. ", z.Command, secondsD(z.LoadSeconds))
	w("At %s `kubectl scale` took the Deployment to 0 replicas (the ReplicaSet controller deleted every model pod), ", secondsD(z.ZeroAtSeconds))
	w("at %s to 1, as an autoscaler seeing the held requests would, whose pod kwok made Ready the cold start later (due at %s), and at %s to all of them. ", secondsD(z.UpAtSeconds), secondsD(z.FirstAtSeconds), secondsD(z.BackAtSeconds))
	w("The dispatchers held the policy at zero (0 slots) from %s to %s; times are since the phase's load started.\n\n", secondsD(z.HeldFromSeconds), secondsD(z.HeldToSeconds))
	w("- **Held:** %d requests were admitted while the pool had no replica (at most %d at once); **%d were served** after the first replica came.\n", z.Held, z.PeakHeld, z.Served)
	w("- **Refused at once:** %d requests got an immediate answer while held.\n", z.Refused)
	w("- **Desired replicas:** the controller's `status.desiredReplicas` reached %d from the dispatchers' acks while the pool was at zero.\n", z.DesiredReplicas)
	for _, t := range z.Tiers {
		w("- **%s**: %s\n", t.Tier, zeroTierWords(t, z.ColdStartSeconds))
	}
	w("\n| tier | bound at zero | maxWait at zero | sent while held | held | served | expired | refused | refusals by cause | wait of held: min | p50 | max | longest wait for the first replica |\n")
	w("|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|\n")
	for _, t := range z.Tiers {
		mw := "none (refused)"
		if t.MaxWaitAtZero > 0 {
			mw = secondsD(t.MaxWaitAtZero)
		}
		w("| %s | %d | %s | %d | %d | %d | %d | %d | %s | %s | %s | %s | %s |\n", t.Tier, t.BoundAtZero, mw, t.Sent, t.Held, t.Served, t.Expired, t.Refused,
			causes(t.RefusedByCause), fmtSecondsN(t.WaitMin, t.Served), fmtSecondsN(t.WaitP50, t.Served), fmtSecondsN(t.WaitMax, t.Served), fmtSecondsN(t.UntilReplica, t.Served))
	}
	j := z.Jobs
	w("\nOver the phase the dispatchers admitted %d requests into their queues: %d dispatched, %d abandoned, %d expired, %d drained", j.Admitted, j.Dispatched, j.Abandoned, j.Expired, j.Drained)
	if j.Idle && j.Admitted == j.Dispatched+j.Abandoned+j.Expired+j.Drained {
		w("; every one ended exactly once.\n")
	} else {
		w(".\n")
	}
	if z.ServiceTiers != "" {
		w("\nWhile held, `kubectl get servicetiers`:\n\n```\n%s\n```\n", strings.TrimRight(z.ServiceTiers, "\n"))
	}
	w("\n![Requests held at zero and their waits](%s)\n", chartZero)
	return b.String()
}

// zeroTierWords is one tier's line of the section.
func zeroTierWords(t zeroTier, coldStart float64) string {
	if t.BoundAtZero == 0 {
		return fmt.Sprintf("its bound at zero is 0 (it cannot wait out the %s cold start): %d of %d requests sent while held got 503 unavailable at once, with Retry-After %ds.",
			secondsD(coldStart), t.RefusedByCause["unavailable"], t.Sent, t.RetryAfter)
	}
	msg := fmt.Sprintf("%d held (bound at zero %d), %d served after the first replica", t.Held, t.BoundAtZero, t.Served)
	if t.Served > 0 {
		msg += fmt.Sprintf(", waiting %s to %s (the first replica's policy came at most %s after any of them arrived; cold start %s)",
			secondsD(t.WaitMin), secondsD(t.WaitMax), secondsD(t.UntilReplica), secondsD(coldStart))
		if t.WithinMaxWait {
			msg += fmt.Sprintf(", within the stated maxWait at zero of %s", secondsD(t.MaxWaitAtZero))
		} else {
			msg += fmt.Sprintf(", **beyond** the stated maxWait at zero of %s", secondsD(t.MaxWaitAtZero))
		}
	}
	if t.Expired > 0 || t.Refused > 0 {
		msg += fmt.Sprintf("; %d expired, %d refused (%s)", t.Expired, t.Refused, causes(t.RefusedByCause))
	}
	return msg + "."
}
