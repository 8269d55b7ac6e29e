package testutil

import (
	"net/http"
	"os/exec"
	"testing"
	"time"
)

// SimCounters are simserver's counts for the whole server or one tenant
// (hack/simserver's stats: Active is a request inside the server, queued
// in its FIFO or generating).
type SimCounters struct {
	Active          int   `json:"active"`
	PeakActive      int   `json:"peakActive"`
	Generating      int   `json:"generating"`
	PeakGenerating  int   `json:"peakGenerating"`
	Requests        int64 `json:"requests"`
	Completed       int64 `json:"completed"`
	Cancelled       int64 `json:"cancelled"`
	CancelledQueued int64 `json:"cancelledQueued"`
	// PromptTokens and CompletionTokens are the tokens of the requests
	// that reached a generation slot (completion: those delivered).
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

// SimArrival is one request as it reached simserver.
type SimArrival struct {
	Tenant    string `json:"tenant"`
	RequestID string `json:"requestId"`
}

// SimStats is simserver's GET /debug/stats.
type SimStats struct {
	SimCounters
	Tenants  map[string]SimCounters `json:"tenants"`
	Arrivals []SimArrival           `json:"arrivals"`
}

// SimOptions say how StartSimserver runs simserver.
type SimOptions struct {
	// Options name the process and say how Cleanup ends it; the default
	// name is "simserver".
	Options
	// Addr is its --listen; the default is a free port on 127.0.0.1.
	Addr string
	// Args are more flags (--concurrency, --service-time, ...).
	Args []string
}

// Simserver is a running hack/simserver.
type Simserver struct {
	*Process
	Addr string
}

// StartSimserver starts bin, a hack/simserver, for t and waits until its
// /health answers 200. Cleanup stops it as StartT does.
func StartSimserver(t testing.TB, bin string, o SimOptions) *Simserver {
	t.Helper()
	if o.Name == "" {
		o.Name = "simserver"
	}
	if o.Addr == "" {
		o.Addr = FreeAddr(t, "127.0.0.1")
	}
	cmd := exec.Command(bin, append([]string{"--listen", o.Addr}, o.Args...)...)
	s := &Simserver{Process: StartT(t, cmd, o.Options), Addr: o.Addr}
	WaitHTTP(t, s.Process, "http://"+o.Addr+"/health", http.StatusOK, 20*time.Second)
	return s
}

// Stats reads GET /debug/stats.
func (s *Simserver) Stats(t testing.TB) SimStats {
	t.Helper()
	var st SimStats
	GetJSON(t, "http://"+s.Addr+"/debug/stats", "", &st)
	return st
}

// ResetStats zeroes the counters (POST /debug/stats/reset).
func (s *Simserver) ResetStats(t testing.TB) {
	t.Helper()
	resp, err := http.Post("http://"+s.Addr+"/debug/stats/reset", "", nil)
	if err != nil {
		t.Fatalf("resetting %s's stats: %v", s.Addr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("resetting %s's stats: %s", s.Addr, resp.Status)
	}
}
