package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
)

type adminError struct {
	Error struct {
		Type           string              `json:"type"`
		Message        string              `json:"message"`
		Errors         []policy.FieldError `json:"errors"`
		CurrentVersion *int64              `json:"current_version"`
	} `json:"error"`
}

// TestAdminAPI walks the admin API through every error case in order; the
// applied policy must survive each refusal.
func TestAdminAPI(t *testing.T) {
	s := startSim(t, "--service-time", "0")
	d := startDispatcher(t, dispOpts{})
	valid := func(v int64) []byte {
		b, _ := json.Marshal(basePolicy(v, 2, s.Addr))
		return b
	}
	var ack policy.Ack
	v5 := int64(5)
	steps := []struct {
		name          string
		method, path  string
		token         string
		body          []byte
		wantCode      int
		wantType      string
		wantMsg       string
		wantErrors    []policy.FieldError
		wantCurrent   *int64
		wantBody      string
		wantReadiness int
	}{
		{name: "readyz before a policy", method: "GET", path: "/readyz", wantCode: 503, wantBody: "no policy yet\n"},
		{name: "healthz", method: "GET", path: "/healthz", wantCode: 200, wantBody: "ok\n"},
		{name: "get policy before any", method: "GET", path: "/v1/policy", token: testToken, wantCode: 404,
			wantType: "no_policy", wantMsg: "no policy has been applied yet"},
		{name: "no token", method: "PUT", path: "/v1/policy", body: valid(5), wantCode: 401,
			wantType: "unauthenticated", wantMsg: `missing bearer token; send "Authorization: Bearer <token>"`},
		{name: "wrong token", method: "PUT", path: "/v1/policy", token: "nope", body: valid(5), wantCode: 401,
			wantType: "unauthenticated", wantMsg: "wrong bearer token"},
		{name: "wrong token on stats", method: "GET", path: "/v1/stats", token: "nope", wantCode: 401,
			wantType: "unauthenticated", wantMsg: "wrong bearer token"},
		{name: "apply v5", method: "PUT", path: "/v1/policy", token: testToken, body: valid(5), wantCode: 200},
		{name: "readyz with a policy", method: "GET", path: "/readyz", wantCode: 200, wantBody: "ok\n"},
		{name: "not JSON", method: "PUT", path: "/v1/policy", token: testToken, body: []byte("{"), wantCode: 400,
			wantType: "invalid_policy", wantMsg: decodeErr("{") + "; the previous policy stays"},
		{name: "unknown field", method: "PUT", path: "/v1/policy", token: testToken, body: []byte(`{"version":6,"tier":"premium"}`), wantCode: 400,
			wantType: "invalid_policy", wantMsg: decodeErr(`{"version":6,"tier":"premium"}`) + "; the previous policy stays"},
		{name: "invalid values", method: "PUT", path: "/v1/policy", token: testToken, wantCode: 400,
			body: func() []byte {
				p := basePolicy(6, 2, s.Addr)
				p.Tiers[1].QueueBound = 0
				p.Tenants[0].Tier = "gold"
				b, _ := json.Marshal(p)
				return b
			}(),
			wantType: "invalid_policy", wantMsg: "the policy has 2 error(s); the previous policy stays",
			wantErrors: []policy.FieldError{
				{Field: "tiers[1].queueBound", Message: "must be >= 1, got 0"},
				{Field: "tenants[0].tier", Message: `names unknown tier "gold"`},
			}},
		{name: "newer schema", method: "PUT", path: "/v1/policy", token: testToken, wantCode: 400,
			body:     []byte(`{"schemaVersion":99,"version":6,"tokens":{"defaultMaxTokens":9}}`),
			wantType: "unsupported_schema",
			wantMsg:  fmt.Sprintf("policy: decode: schemaVersion 99 is newer than %d, the newest this build understands; the previous policy stays", policy.SchemaVersion)},
		{name: "older version", method: "PUT", path: "/v1/policy", token: testToken, body: valid(4), wantCode: 409,
			wantType: "stale_version", wantMsg: "policy version 4 is older than the applied version 5", wantCurrent: &v5},
		{name: "too large", method: "PUT", path: "/v1/policy", token: testToken, body: []byte(`{"pool":"` + strings.Repeat("x", 9<<20) + `"}`), wantCode: 413,
			wantType: "body_too_large", wantMsg: "the policy is larger than 8388608 bytes"},
		{name: "wrong method", method: "DELETE", path: "/v1/policy", token: testToken, wantCode: 405},
		{name: "same version again (resync)", method: "PUT", path: "/v1/policy", token: testToken, body: valid(5), wantCode: 200},
	}
	for _, st := range steps {
		code, body := d.AdminDo(t, st.method, st.path, st.token, st.body)
		if code != st.wantCode {
			t.Fatalf("%s: status %d, want %d; body %s", st.name, code, st.wantCode, body)
		}
		if st.wantBody != "" && string(body) != st.wantBody {
			t.Errorf("%s: body %q, want %q", st.name, body, st.wantBody)
		}
		if st.wantType != "" {
			var e adminError
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("%s: %v in %s", st.name, err, body)
			}
			if e.Error.Type != st.wantType || e.Error.Message != st.wantMsg {
				t.Errorf("%s: got %q %q, want %q %q", st.name, e.Error.Type, e.Error.Message, st.wantType, st.wantMsg)
			}
			if diff := cmp.Diff(st.wantErrors, e.Error.Errors); diff != "" {
				t.Errorf("%s: errors (-want +got)\n%s", st.name, diff)
			}
			if diff := cmp.Diff(st.wantCurrent, e.Error.CurrentVersion); diff != "" {
				t.Errorf("%s: current_version (-want +got)\n%s", st.name, diff)
			}
		}
		if st.wantCode == 200 && st.path == "/v1/policy" {
			if err := json.Unmarshal(body, &ack); err != nil || ack.Version != 5 {
				t.Errorf("%s: ack %s (%v)", st.name, body, err)
			}
		}
		// Whatever was refused, version 5 stays applied.
		if code != 200 && st.path == "/v1/policy" && st.method == "PUT" && st.name != "no token" && st.name != "wrong token" {
			var got policy.Policy
			testutil.GetJSON(t, "http://"+d.Admin+"/v1/policy", testToken, &got)
			if got.Version != 5 {
				t.Errorf("%s: applied version %d after a refusal, want 5", st.name, got.Version)
			}
		}
	}

	// The ack carries measured stats once requests have completed.
	for range 3 {
		if r := d.fetch(context.Background(), t, call{tenant: "acme"}); r.code != 200 {
			t.Fatalf("request: %d %s", r.code, r.body)
		}
	}
	code, body := d.PutPolicy(t, basePolicy(6, 2, s.Addr))
	if code != 200 {
		t.Fatalf("PUT v6: %d %s", code, body)
	}
	if err := json.Unmarshal(body, &ack); err != nil {
		t.Fatal(err)
	}
	if ack.Version != 6 || ack.SchemaVersion != policy.SchemaVersion || ack.Stats.Completed != 3 || ack.Stats.ServiceTimeSeconds <= 0 || ack.Stats.ServiceTimeSeconds > 1 {
		t.Errorf("ack %s", body)
	}
	// The revision is in the header of answers and refusals alike.
	for _, tc := range []struct {
		path, token string
		code        int
	}{{"/healthz", "", 200}, {"/v1/policy", testToken, 200}, {"/v1/stats", "nope", 401}, {"/nothing", "", 404}} {
		req, _ := http.NewRequest(http.MethodGet, d.AdminURL(tc.path), nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got, want := resp.Header.Get(policy.SchemaHeader), fmt.Sprint(policy.SchemaVersion); resp.StatusCode != tc.code || got != want {
			t.Errorf("GET %s: %d with %s %q, want %d with %q", tc.path, resp.StatusCode, policy.SchemaHeader, got, tc.code, want)
		}
	}
	var got policy.Policy
	testutil.GetJSON(t, "http://"+d.Admin+"/v1/policy", testToken, &got)
	if diff := cmp.Diff(*basePolicy(6, 2, s.Addr), got); diff != "" {
		t.Errorf("GET /v1/policy (-want +got)\n%s", diff)
	}
}

// Without --admin-token-file the policy endpoints are closed.
func TestAdminDisabledWithoutToken(t *testing.T) {
	d := testutil.StartDispatcher(t, bins.Tiergate, testutil.DispatcherOptions{NoToken: true})
	code, body := d.AdminDo(t, http.MethodPut, "/v1/policy", "anything", []byte(`{}`))
	var e adminError
	_ = json.Unmarshal(body, &e)
	if code != 401 || e.Error.Message != "the admin API is disabled: the dispatcher was started without --admin-token-file" {
		t.Errorf("got %d %s", code, body)
	}
	d.StopClean(t, 20*time.Second)
}

// --policy-file is re-read when it changes; a bad edit keeps the previous
// policy and says why in the log.
func TestPolicyFileReload(t *testing.T) {
	s := startSim(t, "--service-time", "0")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 2, s.Addr)})
	applied := func() int64 {
		var p policy.Policy
		testutil.GetJSON(t, "http://"+d.Admin+"/v1/policy", testToken, &p)
		return p.Version
	}
	if v := applied(); v != 1 {
		t.Fatalf("version %d at start", v)
	}
	p2 := basePolicy(2, 3, s.Addr)
	testutil.WritePolicyFile(t, d.PolicyFile, p2)
	testutil.EventuallyTrue(t, settle, "version 2 applied", func() bool { return applied() == 2 })
	if st := d.stats(t); st.Queue.Slots != 3 {
		t.Errorf("slots %d after reload, want 3", st.Queue.Slots)
	}

	if err := os.WriteFile(d.PolicyFile, []byte(`{"version": 3, "slots": -1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyTrue(t, settle, "the bad edit logged", func() bool {
		return strings.Contains(d.Output(), `"msg"="keeping the previous policy"`)
	})
	if v := applied(); v != 2 {
		t.Errorf("version %d after a bad edit, want 2", v)
	}
	if r := d.fetch(context.Background(), t, call{tenant: "acme"}); r.code != 200 {
		t.Errorf("data path after a bad edit: %d", r.code)
	}
	d.StopClean(t, 20*time.Second)
}

// Metrics are checked by scraping /metrics after traffic; the series of a
// tier that goes away are deleted; goroutines return to their baseline.
func TestMetricsScrape(t *testing.T) {
	s := startSim(t, "--concurrency", "16", "--service-time", "const:20ms")
	d := startDispatcher(t, dispOpts{policy: basePolicy(3, 4, s.Addr)})
	goroutines := func() float64 { return d.Metrics(t)["go_goroutines{}"] }
	load := func(perClient int) {
		var wg sync.WaitGroup
		for i := range 8 {
			tenant := []string{"acme", "initech", "someone"}[i%3]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perClient {
					r := d.fetch(context.Background(), t, call{tenant: tenant, path: "/v1/chat/completions", body: `{"stream":true,"max_tokens":3}`})
					if r.code != 200 && r.code != 429 {
						t.Errorf("status %d %s", r.code, r.body)
					}
				}
			}()
		}
		wg.Wait()
		http.DefaultClient.CloseIdleConnections()
	}
	// A warm-up at the same concurrency opens the pooled backend
	// connections; the goroutine baseline and the counters are taken
	// after it, and the checks below use differences.
	load(2)
	baseline := settledGoroutines(t, d)
	d.MustPutPolicy(t, basePolicy(3, 4, s.Addr))
	before := d.Metrics(t)

	// Load: 8 clients × 25 requests over three tiers, plus one refusal.
	load(25)
	d.fetch(context.Background(), t, call{})

	m := d.Metrics(t)
	var ok200, refused429 float64
	for _, tier := range []string{"premium", "standard", "free"} {
		k200 := `tiergate_requests_total{code="200",pool="default/llm",tier="` + tier + `"}`
		k429 := `tiergate_requests_total{code="429",pool="default/llm",tier="` + tier + `"}`
		ok200 += m[k200] - before[k200]
		refused429 += m[k429] - before[k429]
	}
	if ok200+refused429 != 200 {
		t.Errorf("200s %v + 429s %v != 200 requests", ok200, refused429)
	}
	want := map[string]float64{
		`tiergate_inflight{pool="default/llm"}`:                                         0,
		`tiergate_slots{pool="default/llm"}`:                                            4,
		`tiergate_utilisation{pool="default/llm"}`:                                      0,
		`tiergate_policy_version{pool="default/llm"}`:                                   3,
		`tiergate_queue_bound{pool="default/llm",tier="premium"}`:                       20,
		`tiergate_queue_bound{pool="default/llm",tier="free"}`:                          240,
		`tiergate_queue_length{pool="default/llm",tier="standard"}`:                     0,
		`tiergate_oldest_queued_age_seconds{pool="default/llm",tier="free"}`:            0,
		`tiergate_backend_inflight{backend="` + s.Addr + `",pool="default/llm"}`:        0,
		`tiergate_rejections_total{cause="unauthenticated",pool="default/llm",tier=""}`: 1,
		`tiergate_requests_total{code="401",pool="default/llm",tier=""}`:                1,
	}
	got := map[string]float64{}
	for k := range want {
		v, ok := m[k]
		if !ok {
			v = -1
		}
		got[k] = v
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	var waitCount float64
	for _, tier := range []string{"premium", "standard", "free"} {
		k := `tiergate_queue_wait_seconds_count{pool="default/llm",tier="` + tier + `"}`
		waitCount += m[k] - before[k]
	}
	if waitCount != ok200 {
		t.Errorf("queue_wait observations %v, want one per 200 (%v)", waitCount, ok200)
	}

	// The standard tier goes away: its series go with it.
	p := basePolicy(4, 4, s.Addr)
	p.Tiers = append(p.Tiers[:1], p.Tiers[2])
	p.Tenants = p.Tenants[:2]
	d.MustPutPolicy(t, p)
	for k := range d.Metrics(t) {
		if strings.Contains(k, `tier="standard"`) {
			t.Errorf("series of the removed tier still exported: %s", k)
		}
	}

	// Goroutines return to (about) the baseline once the load is over: the
	// scrape itself and idle keep-alive connections may hold a few.
	testutil.Eventually(t, 5*time.Second, "goroutines back to the baseline", func() error {
		if n := goroutines(); n > baseline+4 {
			return fmt.Errorf("%v goroutines after the load, baseline %v: a leak", n, baseline)
		}
		return nil
	})
	if st := d.stats(t); st.Active != 0 || st.Queue.InFlight != 0 || st.Queue.Queued != 0 || st.Queue.DoubleReleases != 0 {
		t.Errorf("after load: %+v", st)
	}
}

// decodeErr is the decoder's own message for data; the admin API passes
// it through.
func decodeErr(data string) string {
	_, err := policy.Decode([]byte(data))
	if err == nil {
		return "<decoded without error>"
	}
	return err.Error()
}

// settledGoroutines is the dispatcher's goroutine count once its requests
// have ended and the count has stopped falling: the server's goroutines of
// the connections the client just closed exit on their own time.
func settledGoroutines(t *testing.T, d *disp) float64 {
	t.Helper()
	last := -1.0
	testutil.Eventually(t, settle, "the goroutines settle", func() error {
		st := d.stats(t)
		n := d.Metrics(t)["go_goroutines{}"]
		if st.Active != 0 || st.Queue.InFlight != 0 || n != last {
			last = n
			return fmt.Errorf("%d active, %d in flight, %v goroutines", st.Active, st.Queue.InFlight, n)
		}
		return nil
	})
	return last
}
