package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// series reads every series of one metric family as "label=value,..." ->
// value (counters) or sample count (histograms).
func series(t *testing.T, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			out[strings.Join(ls, ",")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// idle waits until every request has left the handler, so its metrics
// are recorded.
func (f *fixture) idle(t *testing.T) {
	t.Helper()
	if err := f.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Every request is counted in requests_total exactly once, with the status
// the client got, or 499 when the client left first and 502 when the
// backend cut a stream it had started.
func TestRequestsTotalOncePerRequest(t *testing.T) {
	acme := http.Header{"X-Tenant-Id": {"acme"}}
	tests := map[string]struct {
		slots       int
		setup       func(t *testing.T, f *fixture)
		path        string
		header      http.Header
		wantCode    int // what the client sees; 0 when it leaves first
		wantTotal   string
		wantReject  string // the rejections_total series, if any
		wantAbandon string
	}{
		"proxied": {slots: 1, path: "/v1/completions", header: acme, wantCode: 200,
			wantTotal: "code=200,pool=p,tier=premium"},
		"the backend's own status": {slots: 1, path: "/status/404", header: acme, wantCode: 404,
			wantTotal: "code=404,pool=p,tier=premium"},
		"exempt path": {slots: 0, path: "/v1/models", header: acme, wantCode: 200,
			wantTotal: "code=200,pool=p,tier=premium"},
		"401 before the tier is known": {slots: 1, path: "/v1/completions", header: http.Header{}, wantCode: 401,
			wantTotal: "code=401,pool=p,tier=", wantReject: "cause=unauthenticated,pool=p,tier="},
		"400 for a repeated tenant header": {slots: 1, path: "/v1/completions", header: http.Header{"X-Tenant-Id": {"a", "b"}}, wantCode: 400,
			wantTotal: "code=400,pool=p,tier=", wantReject: "cause=bad_request,pool=p,tier="},
		"403 for an unknown tenant": {slots: 1, path: "/v1/completions", header: http.Header{"X-Tenant-Id": {"carol"}}, wantCode: 403,
			wantTotal: "code=403,pool=p,tier=", wantReject: "cause=unknown_tenant,pool=p,tier="},
		"503 with no slots": {slots: 0, path: "/v1/completions", header: acme, wantCode: 503,
			wantTotal: "code=503,pool=p,tier=premium", wantReject: "cause=unavailable,pool=p,tier=premium"},
		"429 with the tier queue full": {slots: 1, path: "/v1/completions", header: acme, wantCode: 429,
			setup:     fillQueue,
			wantTotal: "code=429,pool=p,tier=premium", wantReject: "cause=capacity,pool=p,tier=premium"},
		"502 for a backend that is down": {slots: 1, path: "/v1/completions", header: acme, wantCode: 502,
			setup:     func(t *testing.T, f *fixture) { f.backend.Close() },
			wantTotal: "code=502,pool=p,tier=premium", wantReject: "cause=backend_error,pool=p,tier=premium"},
		"502 for a stream the backend cut": {slots: 1, path: "/cut", header: acme, wantCode: 200,
			wantTotal: "code=502,pool=p,tier=premium"},
		"499 for a client that left mid-stream": {slots: 1, path: "/sse", header: acme,
			wantTotal: "code=499,pool=p,tier=premium", wantAbandon: "pool=p,stage=inflight,tier=premium"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, testPolicy(policy.AuthTrustedHeader, tc.slots))
			if tc.setup != nil {
				tc.setup(t, f)
			}
			if tc.wantCode == 0 {
				f.leaveMidStream(t, tc.path, tc.header)
			} else if got := f.do(t, http.MethodPost, tc.path, tc.header).StatusCode; got != tc.wantCode {
				t.Fatalf("status %d, want %d", got, tc.wantCode)
			}
			f.idle(t)
			check := func(metric, want string) {
				t.Helper()
				wantSeries := map[string]float64{}
				if want != "" {
					wantSeries[want] = 1
				}
				if diff := cmp.Diff(wantSeries, series(t, f.reg, metric)); diff != "" {
					t.Errorf("%s (-want +got)\n%s", metric, diff)
				}
			}
			check("tiergate_requests_total", tc.wantTotal)
			check("tiergate_rejections_total", tc.wantReject)
			check("tiergate_abandoned_total", tc.wantAbandon)
		})
	}
}

// fillQueue takes the only slot and the only queue place (bound 1) of
// premium, so the next request is refused with 429.
func fillQueue(t *testing.T, f *fixture) {
	t.Helper()
	p := testPolicy(policy.AuthTrustedHeader, 1)
	p.Version = 2
	p.Tiers[0].QueueBound, p.Tiers[0].TenantQueueLimit = 1, 1
	p.Backends = []policy.Backend{{Address: strings.TrimPrefix(f.backend.URL, "http://")}}
	f.q.UpdatePolicy(p)
	f.srv.SetPolicy(p)
	for range 2 {
		h, err := f.q.Admit("acme", "premium")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Release)
	}
}

// leaveMidStream reads the first event of path and hangs up.
func (f *fixture) leaveMidStream(t *testing.T, path string, h http.Header) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.front.URL+path, strings.NewReader(`{}`))
	req.Header = h.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
}

// Each SSE event reaches the client while the backend still holds the
// next one back: the status-capturing writer keeps per-event flushing.
func TestSSEFlushedPerEvent(t *testing.T) {
	f := newFixture(t, testPolicy(policy.AuthTrustedHeader, 1))
	f.be.next = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.front.URL+"/sse", strings.NewReader(`{}`))
	req.Header.Set("X-Tenant-Id", "acme")
	type event struct {
		resp  *http.Response
		rd    *bufio.Reader
		lines []string
		err   error
	}
	first := make(chan event, 1)
	go func() {
		var ev event
		ev.resp, ev.err = http.DefaultClient.Do(req) //nolint:bodyclose // closed by the test, which takes ev
		if ev.err != nil {
			first <- ev
			return
		}
		ev.rd = bufio.NewReader(ev.resp.Body)
		for range 2 {
			line, err := ev.rd.ReadString('\n')
			if err != nil {
				ev.err = err
				break
			}
			ev.lines = append(ev.lines, line)
		}
		first <- ev
	}()
	var ev event
	select {
	case ev = <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the first event did not arrive while the backend held the second back: not flushed")
	}
	if ev.err != nil {
		t.Fatal(ev.err)
	}
	defer ev.resp.Body.Close()
	if diff := cmp.Diff([]string{"data: 1\n", "\n"}, ev.lines); diff != "" {
		t.Fatalf("first event (-want +got)\n%s", diff)
	}
	close(f.be.next)
	rest, err := io.ReadAll(ev.rd)
	if err != nil || string(rest) != "data: 2\n\n" {
		t.Fatalf("second event %q, %v", rest, err)
	}
	if ct := ev.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
}

// flushRecorder counts flushes.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushes int
}

func (r *flushRecorder) Flush() { r.flushes++; r.ResponseRecorder.Flush() }

func (r *flushRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errors.New("hijacked")
}

func TestStatusWriter(t *testing.T) {
	tests := map[string]struct {
		do   func(w http.ResponseWriter)
		want int
	}{
		"nothing written is 200": {do: func(http.ResponseWriter) {}, want: 200},
		"a body alone is 200":    {do: func(w http.ResponseWriter) { _, _ = io.WriteString(w, "x") }, want: 200},
		"a flush alone is 200":   {do: func(w http.ResponseWriter) { w.(http.Flusher).Flush() }, want: 200},
		"the first status counts": {do: func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTooManyRequests)
			w.WriteHeader(http.StatusInternalServerError)
		}, want: 429},
		"1xx is informational":             {do: func(w http.ResponseWriter) { w.WriteHeader(http.StatusEarlyHints); w.WriteHeader(http.StatusCreated) }, want: 201},
		"101 is final":                     {do: func(w http.ResponseWriter) { w.WriteHeader(http.StatusSwitchingProtocols) }, want: 101},
		"a status after a body is ignored": {do: func(w http.ResponseWriter) { _, _ = w.Write(nil); w.WriteHeader(http.StatusNotFound) }, want: 200},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
			sw := &statusWriter{ResponseWriter: rec}
			tc.do(sw)
			if got := sw.status(); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
		})
	}
	// Flushes reach the server's writer, through Flusher and through
	// http.ResponseController; so do the abilities only Unwrap exposes.
	rec := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	sw := &statusWriter{ResponseWriter: rec}
	sw.Flush()
	if err := http.NewResponseController(sw).Flush(); err != nil {
		t.Fatal(err)
	}
	if rec.flushes != 2 {
		t.Errorf("flushes %d, want 2", rec.flushes)
	}
	if _, _, err := http.NewResponseController(sw).Hijack(); err == nil || err.Error() != "hijacked" {
		t.Errorf("Hijack through Unwrap: %v", err)
	}
}
