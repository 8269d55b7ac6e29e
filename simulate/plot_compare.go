package simulate

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WriteComparePlot draws the --compare figure as a PNG: goodput and wasted
// service per scheduler (top), and for each tier the distribution of queue
// waits under every scheduler (bottom; x is log-scaled, with the tier's
// tolerableWait dotted).
func WriteComparePlot(w io.Writer, r *Result) error {
	if len(r.Compare) == 0 {
		return fmt.Errorf("%w: the result has no --compare baselines", ErrInvalid)
	}
	names := r.Schedulers()
	goodput, wasted := make([]float64, len(names)), make([]float64, len(names))
	for i, n := range names {
		goodput[i], wasted[i] = r.Of(n).Goodput, r.Of(n).WastedServiceSeconds
	}
	top := []*plot.Plot{
		barPlot("Goodput: answers received per second", "req/s", names, goodput, "%.3f"),
		barPlot("Wasted service: slot-seconds for clients that had left", "slot-seconds", names, wasted, "%.0f"),
	}
	var bottom []*plot.Plot
	for _, tier := range r.tierOrder() {
		p, err := waitPlot(r, tier, names)
		if err != nil {
			return err
		}
		bottom = append(bottom, p)
	}
	width := vg.Length(max(2, len(bottom))) * 4.2 * vg.Inch
	topH, bottomH := 3.2*vg.Inch, 4.4*vg.Inch
	img := vgimg.New(width, topH+bottomH)
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Path())
	pad := draw.Tiles{Rows: 1, PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	rows := []struct {
		plots  []*plot.Plot
		canvas draw.Canvas
	}{
		{top, draw.Crop(dc, 0, 0, bottomH, 0)},
		{bottom, draw.Crop(dc, 0, 0, 0, -topH)},
	}
	for _, row := range rows {
		t := pad
		t.Cols = len(row.plots)
		cs := plot.Align([][]*plot.Plot{row.plots}, t, row.canvas)
		for i, p := range row.plots {
			p.Draw(cs[0][i])
		}
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// barPlot is one bar per scheduler, in the scheduler's colour, with its
// value written above it.
func barPlot(title, unit string, names []string, values []float64, format string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = unit
	p.Y.Min = 0
	var labels []string
	var at plotter.XYs
	for i, v := range values {
		b, err := plotter.NewBarChart(plotter.Values{v}, vg.Points(28))
		if err != nil {
			continue // a NaN or infinite value: no bar
		}
		b.XMin, b.Color, b.LineStyle.Width = float64(i), plotutil.Color(i), 0
		p.Add(b)
		labels = append(labels, fmt.Sprintf(format, v))
		at = append(at, plotter.XY{X: float64(i), Y: v})
	}
	p.NominalX(names...)
	top := slices.Max(values)
	if top <= 0 {
		top = 1
	}
	p.Y.Max = top * 1.2
	if l, err := plotter.NewLabels(plotter.XYLabels{XYs: at, Labels: labels}); err == nil {
		for i := range l.TextStyle {
			l.TextStyle[i].XAlign, l.TextStyle[i].YAlign = draw.XCenter, draw.YBottom
		}
		p.Add(l)
	}
	return p
}

// waitPlot is one tier's empirical distribution of queue waits under every
// scheduler, over the requests dispatched while their client waited.
func waitPlot(r *Result, tier string, names []string) (*plot.Plot, error) {
	t := r.Tiers[tier]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Tier %s: queue wait (tolerableWait %s dotted)", tier, t.tolerableWait)
	p.X.Label.Text = "wait (seconds, log scale)"
	p.Y.Label.Text = "share of dispatched requests waiting at most x"
	p.X.Tick.Marker = waitTicks{}
	// Headroom above 1 holds the legend, off the curves.
	p.Y.Min, p.Y.Max = 0, 1.5
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 0, Label: "0"}, {Value: 0.25, Label: "0.25"}, {Value: 0.5, Label: "0.5"}, {Value: 0.75, Label: "0.75"}, {Value: 1, Label: "1"}})
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs = vg.Points(6)
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	xmax := symlog(t.tolerableWait.Seconds())
	for i, n := range names {
		f := r.Of(n).Tiers[tier]
		label := fmt.Sprintf("%s: %d dispatched, SLO %.1f%%", n, len(f.waits), 100*f.SLOAttainment)
		if len(f.waits) == 0 {
			// Keep the scheduler in the legend: nothing was dispatched.
			l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}})
			if err != nil {
				return nil, err
			}
			l.Color = plotutil.Color(i)
			p.Legend.Add(label, l)
			continue
		}
		l, err := plotter.NewLine(ecdf(f.waits))
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.Dashes = plotutil.Color(i), vg.Points(1.8), plotutil.Dashes(i)
		p.Add(l)
		p.Legend.Add(label, l)
		xmax = max(xmax, symlog(f.waits[len(f.waits)-1]))
	}
	xmax = math.Max(xmax*1.05, symlog(1))
	g, err := plotter.NewLine(plotter.XYs{{X: symlog(t.tolerableWait.Seconds()), Y: 0}, {X: symlog(t.tolerableWait.Seconds()), Y: 1}})
	if err != nil {
		return nil, err
	}
	g.Color, g.Dashes = color.Gray{Y: 60}, []vg.Length{vg.Points(1), vg.Points(3)}
	p.Add(g)
	p.X.Min, p.X.Max = 0, xmax
	return p, nil
}

// ecdf is the empirical distribution of sorted waits as a step line on the
// symlog axis, thinned to at most 400 steps.
func ecdf(sorted []float64) plotter.XYs {
	n := len(sorted)
	step := max(1, n/400)
	pts := plotter.XYs{{X: symlog(sorted[0]), Y: 0}}
	for i := 0; i < n; i += step {
		j := min(i+step, n) - 1
		x := symlog(sorted[j])
		pts = append(pts, plotter.XY{X: x, Y: pts[len(pts)-1].Y}, plotter.XY{X: x, Y: float64(j+1) / float64(n)})
	}
	return pts
}

// symlog maps a wait to log10(1 + s): 0 stays 0, and 1 s, 10 s, 100 s and
// 1000 s are spread evenly.
func symlog(s float64) float64 { return math.Log10(1 + s) }

// waitTicks labels the symlog axis in seconds: 0, 1, 10, 100, … with
// unlabelled ticks at 2–9 of each decade.
type waitTicks struct{}

func (waitTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	add := func(s float64, label string) {
		if x := symlog(s); x >= lo && x <= hi {
			ticks = append(ticks, plot.Tick{Value: x, Label: label})
		}
	}
	add(0, "0")
	for d := 1.0; symlog(d) <= hi; d *= 10 {
		add(d, fmt.Sprintf("%g", d))
		for k := 2.0; k < 10; k++ {
			add(k*d, "")
		}
	}
	return ticks
}
