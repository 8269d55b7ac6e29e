package main

import (
	"fmt"
	"image/color"
	"math"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

const (
	chartWidth  = 10 * vg.Inch
	chartHeight = 5.5 * vg.Inch
)

var (
	dashed  = []vg.Length{vg.Points(5), vg.Points(3)}
	dotted  = []vg.Length{vg.Points(1.5), vg.Points(3)}
	dashDot = []vg.Length{vg.Points(6), vg.Points(3), vg.Points(1.5), vg.Points(3)}
	// causeColors keeps a cause's colour the same in every chart.
	causeColors = map[string]color.Color{
		"capacity":      color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		"tenant_limit":  color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
		"queue_timeout": color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
		"rate_limited":  color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	}
)

// binWidth is the charts' time resolution: about 30 bins over the load,
// whole seconds, at least 2 so that a bin's percentiles have samples.
func binWidth(load time.Duration) float64 {
	return math.Max(2, math.Round(load.Seconds()/30))
}

// newChart is a chart over the load's time axis.
func newChart(title, ylabel string, s *summary) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since the load started"
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

// finish fixes the axes, marks the scale events and saves the chart.
func finish(p *plot.Plot, s *summary, file string) error {
	end := math.Max(s.LoadSeconds+s.GraceSeconds, s.EndedSeconds)
	p.X.Min, p.X.Max = 0, end
	p.Y.Min = 0
	if p.Y.Max <= 0 || math.IsInf(p.Y.Max, 0) || math.IsNaN(p.Y.Max) {
		p.Y.Max = 1
	}
	p.Y.Max *= 1.4 // room for the legend
	labelled := map[int32]bool{}
	for _, e := range s.ScaleEvents {
		l, err := plotter.NewLine(plotter.XYs{{X: e.AtSeconds, Y: 0}, {X: e.AtSeconds, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes, l.Width = color.Gray{Y: 0x40}, dotted, vg.Points(1.5)
		if e.To > e.From {
			l.Dashes = dashDot
		}
		p.Add(l)
		if !labelled[e.To] {
			labelled[e.To] = true
			p.Legend.Add(fmt.Sprintf("pool scaled to %d replicas", e.To), l)
		}
	}
	if s.LoadSeconds < end {
		l, err := plotter.NewLine(plotter.XYs{{X: s.LoadSeconds, Y: 0}, {X: s.LoadSeconds, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes = color.Gray{Y: 0xa0}, dashed
		p.Add(l)
		p.Legend.Add("load stops", l)
	}
	return p.Save(chartWidth, chartHeight, file)
}

// drawWaits: p50 (solid) and p95 (dashed) queue wait per tier, by
// dispatch time.
func drawWaits(file string, s *summary, waits []waitSample) error {
	p := newChart("Queue wait per tier (client-side X-Queue-Wait-Ms)", "wait (seconds)", s)
	bw := binWidth(time.Duration(s.LoadSeconds * float64(time.Second)))
	for i, t := range s.Tiers {
		bins := map[int][]time.Duration{}
		for _, w := range waits {
			if w.Tier == t.Tier {
				bins[int(w.Dispatch.Seconds()/bw)] = append(bins[int(w.Dispatch.Seconds()/bw)], w.Wait)
			}
		}
		keys := sortedKeys(bins)
		var p50, p95 plotter.XYs
		for _, k := range keys {
			x := (float64(k) + 0.5) * bw
			p50 = append(p50, plotter.XY{X: x, Y: percentile(bins[k], .5).Seconds()})
			p95 = append(p95, plotter.XY{X: x, Y: percentile(bins[k], .95).Seconds()})
		}
		if len(keys) == 0 {
			continue
		}
		c := plotutil.Color(i)
		l50, err := plotter.NewLine(p50)
		if err != nil {
			return err
		}
		l50.Color, l50.Width = c, vg.Points(2)
		l95, err := plotter.NewLine(p95)
		if err != nil {
			return err
		}
		l95.Color, l95.Width, l95.Dashes = c, vg.Points(1.5), dashed
		p.Add(l50, l95)
		p.Legend.Add(t.Tier+" p50", l50)
		p.Legend.Add(t.Tier+" p95", l95)
	}
	return finish(p, s, file)
}

// drawRefusals: refusals per second by cause (client-side, when the
// refusal arrived).
func drawRefusals(file string, s *summary, recs []record) error {
	p := newChart("Refusals by cause (all tiers, client-side)", "refusals per second", s)
	bw := binWidth(time.Duration(s.LoadSeconds * float64(time.Second)))
	end := math.Max(s.LoadSeconds+s.GraceSeconds, s.EndedSeconds)
	nbins := int(math.Ceil(end / bw))
	byCause := map[string][]float64{}
	for _, r := range recs {
		if r.Outcome != outcomeRefused {
			continue
		}
		if byCause[r.Cause] == nil {
			byCause[r.Cause] = make([]float64, nbins+1)
		}
		b := min(int(r.End.Seconds()/bw), nbins)
		byCause[r.Cause][b]++
	}
	causes := make([]string, 0, len(byCause))
	for c := range byCause {
		causes = append(causes, c)
	}
	sort.Strings(causes)
	for i, cause := range causes {
		var xy plotter.XYs
		total := 0.0
		for b, n := range byCause[cause] {
			xy = append(xy, plotter.XY{X: (float64(b) + 0.5) * bw, Y: n / bw})
			total += n
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Width = vg.Points(2)
		if c, ok := causeColors[cause]; ok {
			l.Color = c
		} else {
			l.Color = plotutil.Color(i + 3)
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (%.0f)", cause, total), l)
	}
	return finish(p, s, file)
}

// drawQueues: queue length (solid) and bound (dashed) per tier, summed
// over the dispatchers, as scraped every second.
func drawQueues(file string, s *summary, samples []sample, order []string) error {
	p := newChart("Queue length and queue bound per tier (dispatchers' /v1/stats)", "requests", s)
	for i, t := range order {
		var q, b plotter.XYs
		for _, sm := range samples {
			if !sm.OK || sm.T < 0 {
				continue
			}
			ts := sm.Tiers[t]
			q = append(q, plotter.XY{X: sm.T.Seconds(), Y: float64(ts.Queued)})
			b = append(b, plotter.XY{X: sm.T.Seconds(), Y: float64(ts.Bound)})
		}
		if len(q) == 0 {
			continue
		}
		c := plotutil.Color(i)
		lq, err := plotter.NewLine(q)
		if err != nil {
			return err
		}
		lq.Color, lq.Width = c, vg.Points(2)
		lb, err := plotter.NewLine(b)
		if err != nil {
			return err
		}
		lb.Color, lb.Width, lb.Dashes = c, vg.Points(1.5), dashed
		p.Add(lq, lb)
		p.Legend.Add(t+" queued", lq)
		p.Legend.Add(t+" bound", lb)
	}
	return finish(p, s, file)
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}
