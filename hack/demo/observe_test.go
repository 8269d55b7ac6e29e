package main

import (
	"bytes"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestHistogramQuantile(t *testing.T) {
	// Buckets 1, 2, 4 with 10 observations: 2 ≤ 1, 6 ≤ 2, 10 ≤ 4.
	h := &histogram{Upper: []float64{1, 2, 4}, Cum: []float64{2, 6, 10}, Count: 10}
	tests := map[string]struct {
		h    *histogram
		q    float64
		want float64
	}{
		"inside the first bucket":  {h: h, q: 0.1, want: 0.5},
		"inside the second bucket": {h: h, q: 0.5, want: 1.75},
		"inside the last bucket":   {h: h, q: 0.95, want: 3.75},
		"top of a bucket":          {h: h, q: 0.6, want: 2},
		"beyond the finite bounds": {h: &histogram{Upper: []float64{1}, Cum: []float64{1}, Count: 4}, q: 0.9, want: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.h.quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
	if got := (&histogram{}).quantile(.5); !math.IsNaN(got) {
		t.Errorf("empty histogram quantile = %v, want NaN", got)
	}
}

// addMetrics sums what two dispatchers expose, read through the same
// parser the observer uses.
func TestAddMetricsSumsDispatchers(t *testing.T) {
	exposition := func(rejected map[[2]string]float64, waits []float64, ok float64) []byte {
		reg := prometheus.NewRegistry()
		rej := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tiergate_rejections_total"}, []string{"pool", "tier", "cause"})
		req := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tiergate_requests_total"}, []string{"pool", "tier", "code"})
		wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tiergate_queue_wait_seconds", Buckets: []float64{1, 5, 30}}, []string{"pool", "tier"})
		reg.MustRegister(rej, req, wait)
		for k, v := range rejected {
			rej.WithLabelValues("default/llm", k[0], k[1]).Add(v)
		}
		for _, w := range waits {
			wait.WithLabelValues("default/llm", "free").Observe(w)
		}
		req.WithLabelValues("default/llm", "free", "200").Add(ok)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		return b.Bytes()
	}
	s := sample{Refused: map[string]map[string]float64{}, Responses: map[string]map[string]float64{}, Waits: map[string]*histogram{}}
	for _, text := range [][]byte{
		exposition(map[[2]string]float64{{"premium", "tenant_limit"}: 3, {"free", "capacity"}: 1}, []float64{0.5, 2}, 2),
		exposition(map[[2]string]float64{{"premium", "tenant_limit"}: 4}, []float64{10, 40}, 5),
	} {
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		addMetrics(&s, mfs)
	}
	wantRefused := map[string]map[string]float64{"premium": {"tenant_limit": 7}, "free": {"capacity": 1}}
	if diff := cmp.Diff(wantRefused, s.Refused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if got := s.Responses["free"]["200"]; got != 7 {
		t.Errorf("free 200s = %v, want 7", got)
	}
	wantWaits := &histogram{Upper: []float64{1, 5, 30}, Cum: []float64{1, 2, 3}, Count: 4, Sum: 52.5}
	if diff := cmp.Diff(wantWaits, s.Waits["free"]); diff != "" {
		t.Errorf("free waits (-want +got):\n%s", diff)
	}
}
