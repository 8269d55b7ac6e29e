package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
