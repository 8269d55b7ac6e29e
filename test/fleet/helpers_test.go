package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// proc is a child process whose output is kept for failure messages.
type proc struct {
	name string
	*testutil.Process
}

// startProc starts bin; Cleanup stops it with SIGTERM (SIGKILL after 15s)
// and logs the end of its output if the test failed.
func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := testutil.StartT(t, exec.Command(bin, args...), testutil.Options{Name: name, Grace: 15 * time.Second, LogBytes: 4000})
	return &proc{name: name, Process: p}
}

// sim is a running simserver.
type sim struct {
	*proc
	addr string
}

func startSim(t *testing.T, concurrency int, serviceTime string) *sim {
	t.Helper()
	addr := testutil.FreeAddr(t, "127.0.0.1")
	s := &sim{addr: addr}
	s.proc = startProc(t, "simserver", simserverBin, "--listen", addr,
		"--concurrency", strconv.Itoa(concurrency), "--service-time", serviceTime, "--tokens", "4")
	waitHTTP(t, s.proc, "http://"+addr+"/health")
	return s
}

// simCounters is the part of simserver's /debug/stats the tests read.
type simCounters struct {
	Active     int   `json:"active"`
	PeakActive int   `json:"peakActive"`
	Requests   int64 `json:"requests"`
	Completed  int64 `json:"completed"`
}

type simStats struct {
	simCounters
	Tenants map[string]simCounters `json:"tenants"`
}

func (s *sim) stats(t *testing.T) simStats {
	t.Helper()
	var st simStats
	testutil.GetJSON(t, "http://"+s.addr+"/debug/stats", "", &st)
	return st
}

func (s *sim) reset(t *testing.T) {
	t.Helper()
	resp, err := http.Post("http://"+s.addr+"/debug/stats/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("reset: %s", resp.Status)
	}
}

// fleetPolicy is the pool-wide policy of a Redis-mode pool: slots, one tier
// "standard" and tenants with their caps.
func fleetPolicy(backend string, slots, bound, tenantLimit, tenantQueueLimit int, tenants map[string]int) *policy.Policy {
	p := &policy.Policy{
		Version: 1, Pool: "fleet/llm", Slots: slots, ServiceRate: float64(slots), AgeingRate: 6,
		ClientTimeoutSeconds: 60, SharedState: policy.StateRedis,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		DefaultTier:    "standard",
		Tiers: []policy.Tier{{
			Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20,
			QueueBound: bound, TenantConcurrencyLimit: tenantLimit, TenantQueueLimit: tenantQueueLimit,
		}},
		Backends: []policy.Backend{{Address: backend, Scheme: "http"}},
	}
	for id, limit := range tenants {
		p.Tenants = append(p.Tenants, policy.Tenant{ID: id, Tier: "standard", MaxConcurrency: limit})
	}
	return p
}

// dispatcher is a running `tiergate dispatcher`.
type dispatcher struct {
	*proc
	data, admin string
	token       string
}

// startDispatcher runs a dispatcher of p in fleet mode on redisURL.
func startDispatcher(t *testing.T, name, redisURL string, p *policy.Policy, extra ...string) *dispatcher {
	t.Helper()
	dir := t.TempDir()
	pf := filepath.Join(dir, "policy.json")
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(dir, "token")
	if err := os.WriteFile(tf, []byte("fleet-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &dispatcher{
		data:  testutil.FreeAddr(t, "127.0.0.1"),
		admin: testutil.FreeAddr(t, "127.0.0.1"),
		token: "fleet-token",
	}
	args := append([]string{"dispatcher", "--listen", d.data, "--admin-listen", d.admin,
		"--admin-token-file", tf, "--policy-file", pf, "--state", redisURL,
		"--drain-timeout", "2s", "--log-format", "text"}, extra...)
	d.proc = startProc(t, name, tiergateBin, args...)
	waitHTTP(t, d.proc, "http://"+d.admin+"/readyz")
	return d
}

// waitHTTP waits until url answers 200, or fails if the process exits.
func waitHTTP(t *testing.T, p *proc, url string) {
	t.Helper()
	testutil.WaitHTTP(t, p.Process, url, http.StatusOK, 20*time.Second)
}

// metric reads one unlabelled (or first-labelled) sample from /metrics.
func (d *dispatcher) metric(t *testing.T, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + d.admin + "/metrics")
	if err != nil {
		t.Fatalf("%s metrics: %v", d.name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", d.name, line, err)
		}
		return v, true
	}
	return 0, false
}

// queued is the dispatcher's queued count from /v1/stats.
func (d *dispatcher) queued(t *testing.T) int {
	t.Helper()
	var st struct {
		Queue struct {
			Queued   int `json:"Queued"`
			InFlight int `json:"InFlight"`
		} `json:"queue"`
	}
	testutil.GetJSON(t, "http://"+d.admin+"/v1/stats", d.token, &st)
	return st.Queue.Queued
}

// result is one completion request's outcome.
type result struct {
	status int
	body   []byte
	header http.Header
	err    error
	took   time.Duration
}

// errorBody is the dispatcher's refusal body.
type errorBody struct {
	Error struct {
		Type              string `json:"type"`
		Message           string `json:"message"`
		Tier              string `json:"tier"`
		QueuePosition     int    `json:"queue_position"`
		RetryAfterSeconds int    `json:"retry_after_seconds"`
	} `json:"error"`
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// complete sends one chat completion as tenant; serviceTime, when set,
// asks simserver for that service time.
func complete(ctx context.Context, d *dispatcher, tenant, serviceTime string) result {
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hello"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.data+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", tenant)
	if serviceTime != "" {
		req.Header.Set("X-Sim-Service-Time", serviceTime)
	}
	start := time.Now()
	resp, err := httpClient.Do(req)
	if err != nil {
		return result{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, body: b, header: resp.Header, err: err, took: time.Since(start)}
}

// redisURL is the dispatchers' --state for s.
func redisURL(s *redistest.Server) string { return s.URL(0) }
