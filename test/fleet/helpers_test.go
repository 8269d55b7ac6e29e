package fleet

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	tgdispatcher "github.com/tiergate/tiergate/dispatcher"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// procOpts name a child process; Cleanup stops it with SIGTERM (SIGKILL
// after 15s) and logs the end of its output if the test failed.
func procOpts(name string) testutil.Options {
	return testutil.Options{Name: name, Grace: 15 * time.Second, LogBytes: 4000}
}

func startSim(t *testing.T, concurrency int, serviceTime string) *testutil.Simserver {
	t.Helper()
	return testutil.StartSimserver(t, bins.Simserver, testutil.SimOptions{Options: procOpts("simserver"),
		Args: []string{"--concurrency", strconv.Itoa(concurrency), "--service-time", serviceTime, "--tokens", "4"}})
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
	*testutil.Dispatcher
	name string
}

// startDispatcher runs a dispatcher of p in fleet mode on redisURL.
func startDispatcher(t *testing.T, name, redisURL string, p *policy.Policy, extra ...string) *dispatcher {
	t.Helper()
	d := testutil.StartDispatcher(t, bins.Tiergate, testutil.DispatcherOptions{
		Options: procOpts(name), Policy: p, Ready: "/readyz",
		Args: append([]string{"--state", redisURL, "--drain-timeout", "2s"}, extra...),
	})
	return &dispatcher{Dispatcher: d, name: name}
}

// metric is the value of an unlabelled series on /metrics.
func (d *dispatcher) metric(t *testing.T, name string) (float64, bool) {
	t.Helper()
	v, ok := d.Metrics(t)[name+"{}"]
	return v, ok
}

// queued is the dispatcher's queued count from /v1/stats.
func (d *dispatcher) queued(t *testing.T) int {
	t.Helper()
	var st tgdispatcher.Stats
	d.Stats(t, &st)
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

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// complete sends one chat completion as tenant; serviceTime, when set,
// asks simserver for that service time.
func complete(ctx context.Context, d *dispatcher, tenant, serviceTime string) result {
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hello"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.DataURL("/v1/chat/completions"), strings.NewReader(body))
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
