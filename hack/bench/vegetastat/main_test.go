package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRead(t *testing.T) {
	const in = `{"code":200,"timestamp":"2026-01-01T00:00:00Z","latency":9000000,"error":""}
{"code":200,"timestamp":"2026-01-01T00:00:00.5Z","latency":1000000,"error":""}
{"code":429,"timestamp":"2026-01-01T00:00:00.6Z","latency":300000,"error":""}
{"code":200,"timestamp":"2026-01-01T00:00:00.7Z","latency":2000000,"error":""}
{"code":0,"timestamp":"2026-01-01T00:00:00.8Z","latency":5000,"error":"dial tcp: connection refused"}
{"code":503,"timestamp":"2026-01-01T00:00:00.9Z","latency":5000,"error":""}
`
	s, err := read(strings.NewReader(in), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{
		"n": s.n, "errors": s.errors, "firstError": s.firstError,
		"ok": s.ok, "refused": s.refused, "span": s.last.Sub(s.first),
	}
	want := map[string]any{
		"n": 5, "errors": 2, "firstError": "dial tcp: connection refused",
		"ok":      []time.Duration{time.Millisecond, 2 * time.Millisecond},
		"refused": []time.Duration{300 * time.Microsecond},
		"span":    400*time.Millisecond + 5*time.Microsecond, // 0.5 s to the 503's end
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if q := quantile(s.ok, .99); q != 2000 {
		t.Errorf("p99 = %v µs, want 2000", q)
	}
}

func TestReadRejects(t *testing.T) {
	for name, in := range map[string]string{"empty": "", "not JSON": "{"} {
		if _, err := read(strings.NewReader(in), 0); err == nil {
			t.Errorf("%s: read succeeded", name)
		}
	}
}
