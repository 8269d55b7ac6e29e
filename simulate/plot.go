package simulate

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlot draws wait over time per tier as a PNG: the mean wait of the
// requests dispatched in each time bucket (solid), the longest (dashed),
// and the tier's stated maxWait (dotted). Time covers the whole run,
// warm-up included; a vertical line marks the end of warm-up.
func WritePlot(w io.Writer, r *Result) error {
	if len(r.series) == 0 {
		return fmt.Errorf("%w: the result has no time series (was it decoded from JSON?)", ErrInvalid)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Queue wait over time, pool %s (seed %d)\nsolid: mean, dashed: longest, dotted: stated maxWait", r.Pool, r.Seed)
	p.X.Label.Text = "simulated time (minutes)"
	p.Y.Label.Text = "wait (seconds)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())

	end := r.SimulatedSeconds / 60
	for i, name := range r.tierOrder() {
		if err := plotTier(p, name, r.series[name], plotutil.Color(i), end); err != nil {
			return err
		}
	}
	// Headroom above the highest line keeps the legend off the data.
	p.Y.Max *= 1.3
	if r.WarmupSeconds > 0 {
		wu, err := plotter.NewLine(plotter.XYs{{X: r.WarmupSeconds / 60, Y: 0}, {X: r.WarmupSeconds / 60, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		wu.Color = color.Gray{Y: 80}
		wu.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(wu)
		p.Legend.Add("end of warm-up", wu)
	}
	p.X.Min, p.X.Max = 0, end
	p.Y.Min = 0
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "png")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// plotTier draws one tier's mean and longest waits and its stated maxWait
// up to end (minutes).
func plotTier(p *plot.Plot, name string, s *series, col color.Color, end float64) error {
	var dispatched, expired int64
	for b := range s.count {
		dispatched += s.count[b]
		expired += s.expired[b]
	}
	label := fmt.Sprintf("%s (%d dispatched, %d expired)", name, dispatched, expired)
	// One line per run of buckets with dispatches: a gap in the data stays
	// a gap in the plot.
	first := true
	for _, run := range s.runs() {
		var mean, longest plotter.XYs
		for _, b := range run {
			x := (float64(b) + 0.5) * s.width / 60
			mean = append(mean, plotter.XY{X: x, Y: s.sum[b] / float64(s.count[b])})
			longest = append(longest, plotter.XY{X: x, Y: s.max[b]})
		}
		l, pts, err := plotter.NewLinePoints(mean)
		if err != nil {
			return err
		}
		l.Color, l.Width = col, vg.Points(1.5)
		pts.Color, pts.Radius = col, vg.Points(1)
		m, err := plotter.NewLine(longest)
		if err != nil {
			return err
		}
		m.Color, m.Dashes = col, []vg.Length{vg.Points(4), vg.Points(2)}
		p.Add(l, pts, m)
		if first {
			p.Legend.Add(label, l)
			first = false
		}
	}
	g, err := plotter.NewLine(plotter.XYs{{X: 0, Y: s.maxWaitSec}, {X: end, Y: s.maxWaitSec}})
	if err != nil {
		return err
	}
	g.Color, g.Dashes = col, []vg.Length{vg.Points(1), vg.Points(3)}
	p.Add(g)
	if first {
		p.Legend.Add(label, g)
	}
	return nil
}
