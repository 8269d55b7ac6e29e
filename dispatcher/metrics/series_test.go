package metrics

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// A Series counts into the very series the label-taking methods do, and
// creates none before its first use.
func TestSeriesSharesTheVectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg, func() Snapshot { return Snapshot{} })
	if err != nil {
		t.Fatal(err)
	}
	s := m.Series("default/llm", "premium")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("an unused Series created %d series (%v)", n, err)
	}
	s.Request(200)
	s.Request(200)
	m.Request("default/llm", "premium", 200)
	s.Request(429)
	s.Request(1000) // not a status: the label path still counts it
	s.Reject(queue.CauseCapacity)
	m.Reject("default/llm", "premium", queue.CauseCapacity)
	s.Reject("not-a-cause")
	s.ObserveWait(2 * time.Millisecond)
	s.ObserveService(30 * time.Millisecond)
	want := `
# HELP tiergate_rejections_total Refused requests by cause (` + strings.Join(queue.Causes(), ", ") + `).
# TYPE tiergate_rejections_total counter
tiergate_rejections_total{cause="capacity",pool="default/llm",tier="premium"} 2
tiergate_rejections_total{cause="not-a-cause",pool="default/llm",tier="premium"} 1
# HELP tiergate_requests_total Finished requests by HTTP status sent (499: the client went away first).
# TYPE tiergate_requests_total counter
tiergate_requests_total{code="1000",pool="default/llm",tier="premium"} 1
tiergate_requests_total{code="200",pool="default/llm",tier="premium"} 3
tiergate_requests_total{code="429",pool="default/llm",tier="premium"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tiergate_requests_total", "tiergate_rejections_total"); err != nil {
		t.Error(err)
	}
	got := map[string]uint64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if h := mf.GetMetric()[0].GetHistogram(); h != nil {
			got[mf.GetName()] = h.GetSampleCount()
		}
	}
	if diff := cmp.Diff(map[string]uint64{"tiergate_queue_wait_seconds": 1, "tiergate_service_seconds": 1}, got); diff != "" {
		t.Errorf("histogram samples (-want +got):\n%s", diff)
	}
}

// BenchmarkRequestCounter: one requests_total increment by label values
// (a hash and a map lookup per call) against a Series.
func BenchmarkRequestCounter(b *testing.B) {
	m, err := New(prometheus.NewRegistry(), func() Snapshot { return Snapshot{} })
	if err != nil {
		b.Fatal(err)
	}
	b.Run("labels", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.Request("default/llm", "premium", 200)
			m.ObserveWait("default/llm", "premium", time.Millisecond)
			m.ObserveService("default/llm", "premium", time.Millisecond)
		}
	})
	b.Run("series", func(b *testing.B) {
		s := m.Series("default/llm", "premium")
		b.ReportAllocs()
		for b.Loop() {
			s.Request(200)
			s.ObserveWait(time.Millisecond)
			s.ObserveService(time.Millisecond)
		}
	})
}

// tokens_total counts by kind on the Series' pool and tier; the estimate
// error is one histogram per pool, which every tier's Series shares. A tier
// that goes away takes its tokens_total with it, and a new pool the old
// pool's histogram.
func TestTokenSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg, func() Snapshot { return Snapshot{} })
	if err != nil {
		t.Fatal(err)
	}
	m.SetTiers("p", []string{"premium", "free"})
	premium, free := m.Series("p", "premium"), m.Series("p", "free")
	premium.Tokens(120, 30)
	premium.Tokens(5, 0)
	m.Tokens("p", "premium", 1, 2)
	free.Tokens(7, 9)
	for _, r := range []float64{1, 1.1, 0.5, 3.9, 100} {
		premium.ObserveEstimateError(r)
	}
	free.ObserveEstimateError(1)
	m.ObserveEstimateError("p", 0.9)

	want := `
# HELP tiergate_tokens_total Tokens settled against requests that reached a backend, by kind (prompt, completion): the answer's usage, else the estimate.
# TYPE tiergate_tokens_total counter
tiergate_tokens_total{kind="completion",pool="p",tier="free"} 9
tiergate_tokens_total{kind="completion",pool="p",tier="premium"} 32
tiergate_tokens_total{kind="prompt",pool="p",tier="free"} 7
tiergate_tokens_total{kind="prompt",pool="p",tier="premium"} 126
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tiergate_tokens_total"); err != nil {
		t.Error(err)
	}
	h := estimateHistogram(t, reg, "p")
	got := map[string]float64{"count": float64(h.GetSampleCount()), "sum": h.GetSampleSum()}
	for _, b := range h.GetBucket() {
		switch b.GetUpperBound() {
		case 0.5, 1, 4:
			got["le "+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)] = float64(b.GetCumulativeCount())
		}
	}
	wantH := map[string]float64{"count": 7, "sum": 1 + 1.1 + 0.5 + 3.9 + 100 + 1 + 0.9, "le 0.5": 1, "le 1": 4, "le 4": 6}
	if diff := cmp.Diff(wantH, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("estimate error histogram (-want +got):\n%s", diff)
	}
	if n := len(h.GetBucket()); n != 17 {
		t.Errorf("%d buckets, want 17 (0.25 to 4)", n)
	}

	m.SetTiers("p", []string{"premium"})
	if n := testutil.CollectAndCount(m.tokens); n != 2 {
		t.Errorf("tokens_total series after free went: %d, want premium's 2", n)
	}
	m.SetTiers("q", []string{"premium"})
	if n := testutil.CollectAndCount(m.tokens) + testutil.CollectAndCount(m.estimate); n != 0 {
		t.Errorf("%d token series of pool p left after the pool changed", n)
	}
}

// estimateHistogram is pool's token_estimate_error_ratio.
func estimateHistogram(t *testing.T, reg prometheus.Gatherer, pool string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tiergate_token_estimate_error_ratio" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if mt.GetLabel()[0].GetValue() == pool {
				return mt.GetHistogram()
			}
		}
	}
	t.Fatalf("no token_estimate_error_ratio of pool %q", pool)
	return nil
}
