package testutil

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// post sends a completion request for tenant to simserver.
func post(t *testing.T, s *Simserver, tenant string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr+"/v1/completions", strings.NewReader(`{"max_tokens":1,"prompt":"12345678"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Tiergate-Tenant", tenant)
	req.Header.Set("X-Request-Id", "r-"+tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s %v", resp.Status, err)
	}
}

func TestSimserver(t *testing.T) {
	s := StartSimserver(t, binaries(t).Simserver, SimOptions{Args: []string{"--service-time", "0"}})
	post(t, s, "a")
	post(t, s, "b")
	// 8 bytes at the default 4 bytes per token, and the one token asked for.
	one := SimCounters{PeakActive: 1, PeakGenerating: 1, Requests: 1, Completed: 1, PromptTokens: 2, CompletionTokens: 1}
	want := SimStats{
		SimCounters: SimCounters{PeakActive: 1, PeakGenerating: 1, Requests: 2, Completed: 2, PromptTokens: 4, CompletionTokens: 2},
		Tenants:     map[string]SimCounters{"a": one, "b": one},
		Arrivals:    []SimArrival{{Tenant: "a", RequestID: "r-a"}, {Tenant: "b", RequestID: "r-b"}},
	}
	if diff := cmp.Diff(want, s.Stats(t)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	// SimStats knows every field simserver sends.
	var raw json.RawMessage
	GetJSON(t, "http://"+s.Addr+"/debug/stats", "", &raw)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&SimStats{}); err != nil {
		t.Errorf("simserver sends what SimStats lacks: %v\n%s", err, raw)
	}
	s.ResetStats(t)
	if diff := cmp.Diff(SimStats{Tenants: map[string]SimCounters{}, Arrivals: []SimArrival{}}, s.Stats(t)); diff != "" {
		t.Errorf("stats after the reset (-want +got):\n%s", diff)
	}
}

func TestSimserverFailures(t *testing.T) {
	bins := binaries(t)
	t.Run("a bad flag", func(t *testing.T) {
		r := &recorder{TB: t}
		r.do(func() { StartSimserver(r, bins.Simserver, SimOptions{Args: []string{"--concurrency", "0"}}) })
		r.runCleanups()
		if len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], bins.Simserver+" exited while starting (exit status 2):\n") {
			t.Errorf("failures %q, want the early exit", r.errs)
		}
	})
	t.Run("stats of a stopped server", func(t *testing.T) {
		s := StartSimserver(t, bins.Simserver, SimOptions{})
		s.Kill()
		for name, f := range map[string]func(testing.TB){
			"Stats":      func(tb testing.TB) { s.Stats(tb) },
			"ResetStats": func(tb testing.TB) { s.ResetStats(tb) },
		} {
			r := &recorder{TB: t}
			r.do(func() { f(r) })
			if !r.fatal || len(r.errs) != 1 || !strings.Contains(r.errs[0], "connection refused") {
				t.Errorf("%s: failures %q, want one about the refused connection", name, r.errs)
			}
		}
	})
}
