package testutil

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestScrape(t *testing.T) {
	const exposition = `# TYPE requests_total counter
requests_total{tier="free",code="200"} 3
requests_total{code="429",tier="free"} 1
# TYPE up gauge
up 1
# TYPE wait_seconds histogram
wait_seconds_bucket{tier="free",le="1"} 2
wait_seconds_bucket{tier="free",le="+Inf"} 5
wait_seconds_sum{tier="free"} 4.5
wait_seconds_count{tier="free"} 5
# TYPE rpc summary
rpc{quantile="0.5"} 1
rpc_sum 1
rpc_count 1
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte(exposition))
		case "/bad":
			_, _ = w.Write([]byte("up{ 1\n"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	want := map[string]float64{
		`requests_total{code="200",tier="free"}`: 3,
		`requests_total{code="429",tier="free"}`: 1,
		`up{}`:                                   1,
		`wait_seconds_count{tier="free"}`:        5,
	}
	if diff := cmp.Diff(want, Scrape(t, srv.URL+"/metrics")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for path, wantErr := range map[string]string{
		"/bad":   "scraping " + srv.URL + "/bad: text format parsing error",
		"/other": "scraping " + srv.URL + "/other: 404 Not Found",
	} {
		r := &recorder{TB: t}
		r.do(func() { Scrape(r, srv.URL+path) })
		if !r.fatal || len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], wantErr) {
			t.Errorf("%s: failures %q, want %q", path, r.errs, wantErr)
		}
	}
}

func TestParseRefusal(t *testing.T) {
	body := `{"error":{"type":"capacity","message":"full","tier":"free","queue_position":3,"retry_after_seconds":2}}`
	var want Refusal
	want.Error.Type, want.Error.Message, want.Error.Tier = "capacity", "full", "free"
	want.Error.QueuePosition, want.Error.RetryAfterSeconds = 3, 2
	if diff := cmp.Diff(want, ParseRefusal(t, []byte(body))); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for name, bad := range map[string]string{
		"an unknown field": `{"error":{"type":"capacity","extra":1}}`,
		"not JSON":         `full`,
	} {
		r := &recorder{TB: t}
		r.do(func() { ParseRefusal(r, []byte(bad)) })
		if !r.fatal || len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], "refusal body \""+strings.ReplaceAll(bad, `"`, `\"`)+"\": ") {
			t.Errorf("%s: failures %q", name, r.errs)
		}
	}
}
