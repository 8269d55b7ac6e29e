package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeDispatcher struct {
	mu       sync.Mutex
	pol      *policy.Policy
	draining bool
}

func (f *fakeDispatcher) Apply(p *policy.Policy) (policy.Ack, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pol != nil {
		if err := policy.CheckPool(f.pol.Pool, p.Pool); err != nil {
			return policy.Ack{}, err
		}
		if err := policy.CheckVersion(f.pol.Version, p.Version); err != nil {
			return policy.Ack{}, err
		}
	}
	f.pol = p
	return policy.Ack{Version: p.Version, Stats: policy.Measured{Completed: 7, ServiceTimeSeconds: 1.5}}, nil
}

func (f *fakeDispatcher) Policy() *policy.Policy { f.mu.Lock(); defer f.mu.Unlock(); return f.pol }
func (f *fakeDispatcher) Stats() any             { return map[string]int{"queued": 3} }
func (f *fakeDispatcher) Ready() (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.draining:
		return false, "draining"
	case f.pol == nil:
		return false, "no policy yet"
	}
	return true, ""
}

const validPolicy = `{"version":%d,"pool":"p","slots":1,"serviceRate":1,"ageingRate":6,
"authentication":{"mode":"TrustedHeader","headerName":"X-Tenant-ID"},
"tiers":[{"name":"premium","basePriority":0,"tolerableWaitSeconds":5,"queueBound":1,"tenantConcurrencyLimit":1,"tenantQueueLimit":1}],
"backends":[{"address":"127.0.0.1:8000"}]}`

func TestHandler(t *testing.T) {
	type step struct {
		method, path, token, body string
		wantCode                  int
		wantBody                  string
		wantVersion               int64 // of the Policy a GET answers
	}
	tests := map[string]struct {
		token []byte
		steps []step
	}{
		"policy lifecycle": {
			token: []byte("s3cret"),
			steps: []step{
				{method: "GET", path: "/readyz", wantCode: 503, wantBody: "no policy yet\n"},
				{method: "GET", path: "/v1/policy", token: "s3cret", wantCode: 404,
					wantBody: `{"error":{"type":"no_policy","message":"no policy has been applied yet"}}`},
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: fmt.Sprintf(validPolicy, 3), wantCode: 200,
					wantBody: `{"version":3,"schemaVersion":3,"stats":{"serviceTimeSeconds":1.5,"completed":7}}`},
				{method: "GET", path: "/readyz", wantCode: 200, wantBody: "ok\n"},
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: fmt.Sprintf(validPolicy, 2), wantCode: 409,
					wantBody: `{"error":{"type":"stale_version","message":"policy version 2 is older than the applied version 3","current_version":3}}`},
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: strings.Replace(fmt.Sprintf(validPolicy, 9), `"pool":"p"`, `"pool":"q"`, 1), wantCode: 409,
					wantBody: `{"error":{"type":"pool_mismatch","message":"this dispatcher holds the policy of pool \"p\" and refuses one for pool \"q\": a dispatcher serves one pool until it restarts (do two ModelPools select the same dispatcher pods?)","current_pool":"p"}}`},
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: `{"version":4,"slots":-1}`, wantCode: 400,
					wantBody: `{"error":{"type":"invalid_policy","message":"the policy has 4 error(s); the previous policy stays","errors":[` +
						`{"field":"slots","message":"must be \u003e= 0, got -1"},{"field":"ageingRate","message":"must be a finite number \u003e 0, got 0"},` +
						`{"field":"authentication.mode","message":"must be \"TrustedHeader\", \"APIKey\" or \"JWT\", got \"\""},{"field":"tiers","message":"at least one tier is required"}]}}`},
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: `{"version":4,"bogus":1}`, wantCode: 400,
					wantBody: `{"error":{"type":"invalid_policy","message":"policy: decode: json: unknown field \"bogus\"; the previous policy stays"}}`},
				// A newer schema is named as such, not as its unknown field.
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: `{"schemaVersion":4,"version":4,"futureField":{"mode":"x"}}`, wantCode: 400,
					wantBody: `{"error":{"type":"unsupported_schema","message":"policy: decode: schemaVersion 4 is newer than 3, the newest this build understands; the previous policy stays"}}`},
				{method: "PUT", path: "/v1/policy", token: "s3cret", body: `{"schemaVersion":1,` + fmt.Sprintf(validPolicy, 4)[1:], wantCode: 200,
					wantBody: `{"version":4,"schemaVersion":3,"stats":{"serviceTimeSeconds":1.5,"completed":7}}`},
				{method: "GET", path: "/v1/nothing", token: "s3cret", wantCode: 404, wantBody: "404 page not found\n"},
				{method: "GET", path: "/v1/policy", token: "s3cret", wantCode: 200, wantVersion: 4},
				{method: "GET", path: "/v1/stats", token: "s3cret", wantCode: 200, wantBody: `{"queued":3}`},
				{method: "GET", path: "/healthz", wantCode: 200, wantBody: "ok\n"},
			},
		},
		"tokens": {
			token: []byte("s3cret"),
			steps: []step{
				{method: "GET", path: "/v1/stats", wantCode: 401,
					wantBody: `{"error":{"type":"unauthenticated","message":"missing bearer token; send \"Authorization: Bearer \u003ctoken\u003e\""}}`},
				{method: "GET", path: "/v1/stats", token: "s3cre", wantCode: 401,
					wantBody: `{"error":{"type":"unauthenticated","message":"wrong bearer token"}}`},
				{method: "GET", path: "/v1/stats", token: "s3cret", wantCode: 200, wantBody: `{"queued":3}`},
			},
		},
		"disabled without a token": {
			steps: []step{
				{method: "GET", path: "/v1/stats", token: "", wantCode: 401,
					wantBody: `{"error":{"type":"unauthenticated","message":"the admin API is disabled: the dispatcher was started without --admin-token-file"}}`},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			h, err := New(Config{Token: tc.token, Gatherer: reg, Log: logr.Discard()}, &fakeDispatcher{})
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				req := httptest.NewRequest(st.method, st.path, strings.NewReader(st.body))
				if st.token != "" {
					req.Header.Set("Authorization", "Bearer "+st.token)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != st.wantCode {
					t.Fatalf("step %d %s %s: %d, want %d: %s", i, st.method, st.path, rec.Code, st.wantCode, rec.Body)
				}
				if st.wantBody != "" {
					if diff := cmp.Diff(st.wantBody, strings.TrimSuffix(rec.Body.String(), "\n")+suffix(st.wantBody)); diff != "" {
						t.Errorf("step %d (-want +got)\n%s", i, diff)
					}
				}
				if st.wantVersion != 0 {
					var p policy.Policy
					if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Version != st.wantVersion {
						t.Errorf("step %d: policy %s (%v), want version %d", i, rec.Body, err, st.wantVersion)
					}
				}
				// Every answer names the schema revision, refusals too.
				if got := rec.Header().Get(policy.SchemaHeader); got != "3" {
					t.Errorf("step %d: %s %q, want \"3\"", i, policy.SchemaHeader, got)
				}
				if st.wantCode == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") != `Bearer realm="tiergate-admin"` {
					t.Errorf("step %d: no WWW-Authenticate", i)
				}
			}
		})
	}
}

// suffix keeps a wanted trailing newline (plain-text answers end in one).
func suffix(want string) string {
	if strings.HasSuffix(want, "\n") {
		return "\n"
	}
	return ""
}

// Profiles are served only when asked for, and only to the admin token.
func TestProfiling(t *testing.T) {
	tests := map[string]struct {
		profiling bool
		token     string // the request's
		path      string
		wantCode  int
		wantBody  string // a prefix of it
	}{
		"off by default": {path: "/debug/pprof/", token: "s3cret", wantCode: 404, wantBody: "404 page not found"},
		"no token": {profiling: true, path: "/debug/pprof/heap", wantCode: 401,
			wantBody: `{"error":{"type":"unauthenticated","message":"missing bearer token; send \"Authorization: Bearer \u003ctoken\u003e\""}}`},
		"wrong token": {profiling: true, path: "/debug/pprof/goroutine?debug=1", token: "nope", wantCode: 401,
			wantBody: `{"error":{"type":"unauthenticated","message":"wrong bearer token"}}`},
		"index":       {profiling: true, path: "/debug/pprof/", token: "s3cret", wantCode: 200, wantBody: "<html>"},
		"heap, text":  {profiling: true, path: "/debug/pprof/heap?debug=1", token: "s3cret", wantCode: 200, wantBody: "heap profile: "},
		"CPU profile": {profiling: true, path: "/debug/pprof/profile?seconds=1", token: "s3cret", wantCode: 200, wantBody: "\x1f\x8b"}, // gzipped protobuf
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, err := New(Config{Token: []byte("s3cret"), Gatherer: prometheus.NewRegistry(), Profiling: tc.profiling, Log: logr.Discard()}, &fakeDispatcher{})
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || !strings.HasPrefix(rec.Body.String(), tc.wantBody) {
				t.Errorf("GET %s: %d %.60q, want %d starting %q", tc.path, rec.Code, rec.Body.String(), tc.wantCode, tc.wantBody)
			}
		})
	}
}
