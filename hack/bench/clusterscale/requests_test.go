package clusterscale

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRESTClientRequests(t *testing.T) {
	scrape := map[string]float64{
		`rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"}`:   40,
		`rest_client_requests_total{code="404",host="127.0.0.1:6443",method="GET"}`:   2,
		`rest_client_requests_total{code="200",host="127.0.0.1:6443",method="PATCH"}`: 6,
		`rest_client_requests_total{code="409",host="127.0.0.1:6443",method="PUT"}`:   1,
		`rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"}`:  3,
		`rest_client_request_duration_seconds_count{method="GET"}`:                    99,
		`workqueue_adds_total{name="push"}`:                                           7,
	}
	r, w := RESTClientRequests(scrape)
	if diff := cmp.Diff([]int{42, 10}, []int{r, w}); diff != "" {
		t.Errorf("reads, writes (-want +got):\n%s", diff)
	}
}

const auditLines = `{"kind":"Event","level":"Metadata","auditID":"a1","stage":"ResponseStarted","verb":"watch","user":{"username":"ctl"},"objectRef":{"resource":"pods","namespace":"scale"},"requestReceivedTimestamp":"2026-05-01T03:00:00.500000Z"}
{"kind":"Event","level":"Metadata","auditID":"a2","stage":"ResponseComplete","verb":"patch","user":{"username":"ctl"},"objectRef":{"resource":"modelpools","namespace":"scale","name":"llm","subresource":"status"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-05-01T03:00:01Z"}
{"kind":"Event","level":"Metadata","auditID":"a3","stage":"ResponseComplete","verb":"create","user":{"username":"ctl"},"objectRef":{"resource":"events","namespace":"scale"},"responseStatus":{"code":201},"requestReceivedTimestamp":"2026-05-01T03:00:01.200000Z"}
{"kind":"Event","level":"Metadata","auditID":"a4","stage":"ResponseComplete","verb":"patch","user":{"username":"admin"},"objectRef":{"resource":"deployments"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-05-01T03:00:01.300000Z"}
{"kind":"Event","level":"Metadata","auditID":"a5","stage":"ResponseComplete","verb":"get","user":{"username":"ctl"},"requestURI":"/version","responseStatus":{"code":200},"requestReceivedTimestamp":"2026-05-01T03:00:01.400000Z"}
{"kind":"Event","level":"Metadata","auditID":"a2","stage":"Panic","verb":"patch","user":{"username":"ctl"},"objectRef":{"resource":"modelpools","subresource":"status"},"requestReceivedTimestamp":"2026-05-01T03:00:01Z"}
{"kind":"Event","level":"Metadata","auditID":"a6","stage":"ResponseComplete","verb":"update","user":{"username":"ctl"},"objectRef":{"resource":"modelpools","subresource":"status"},"responseStatus":{"code":409},"requestReceivedTimestamp":"2026-05-01T03:00:02Z"}
{"kind":"Event","level":"Metadata","auditID":"a1","stage":"ResponseComplete","verb":"watch","user":{"username":"ctl"},"objectRef":{"resource":"pods"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-05-01T03:00:00.500000Z"}`

func TestParseAudit(t *testing.T) {
	evs, err := ParseAudit(strings.NewReader(auditLines))
	if err != nil {
		t.Fatal(err)
	}
	want := []AuditEvent{
		{At: at(500), User: "ctl", Verb: "watch", Resource: "pods"},
		{At: at(1000), User: "ctl", Verb: "patch", Resource: "modelpools/status", Code: 200},
		{At: at(1200), User: "ctl", Verb: "create", Resource: "events", Code: 201},
		{At: at(1300), User: "admin", Verb: "patch", Resource: "deployments", Code: 200},
		{At: at(1400), User: "ctl", Verb: "get", Resource: "(non-resource)", Code: 200},
		{At: at(2000), User: "ctl", Verb: "update", Resource: "modelpools/status", Code: 409},
	}
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("ParseAudit (-want +got):\n%s", diff)
	}
	if _, err := ParseAudit(strings.NewReader("{\"auditID\":\n")); err == nil || err.Error() != "audit line 1: unexpected end of JSON input" {
		t.Errorf("a cut line: error %v", err)
	}
}

func TestCountRequests(t *testing.T) {
	evs, err := ParseAudit(strings.NewReader(auditLines))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		from, to time.Time
		want     Requests
	}{
		{"all of ctl's", at(0), at(3000), Requests{Reads: 2, Writes: 3, WritesBy: map[string]int{
			"patch modelpools/status": 1, "create events": 1, "update modelpools/status": 1}}},
		{"from inclusive, to exclusive", at(1000), at(2000), Requests{Reads: 1, Writes: 2, WritesBy: map[string]int{
			"patch modelpools/status": 1, "create events": 1}}},
		{"nothing in the window", at(3000), at(4000), Requests{WritesBy: map[string]int{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, CountRequests(evs, "ctl", tc.from, tc.to)); diff != "" {
				t.Errorf("CountRequests (-want +got):\n%s", diff)
			}
		})
	}
}
