package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/internal/testutil"
)

var tiergateBin, simserverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tiergate-dispatcher-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	tiergateBin = filepath.Join(dir, "tiergate")
	simserverBin = filepath.Join(dir, "simserver")
	// With TIERGATE_TEST_RACE the binaries under test run with the race
	// detector.
	opts := testutil.BuildOptions{Race: testutil.RaceRequested()}
	for bin, pkg := range map[string]string{tiergateBin: "github.com/tiergate/tiergate", simserverBin: "github.com/tiergate/tiergate/hack/simserver"} {
		if err := testutil.BuildBinary(root, bin, pkg, opts); err != nil {
			fmt.Fprintln(os.Stderr, "building", pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	return testutil.FreeAddr(t, "127.0.0.1")
}

// proc is a child process with its output captured.
type proc struct{ *testutil.Process }

// startProc starts bin; Cleanup kills it, fails the test on a data race
// report and logs the output of a failed test.
func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return &proc{testutil.StartT(t, exec.Command(bin, args...), testutil.Options{Name: filepath.Base(bin)})}
}

// signal sends sig.
func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// wait waits for the exit and returns it; it fails the test after within.
func (p *proc) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	exited, err := p.Wait(within)
	if !exited {
		t.Fatalf("process did not exit within %s", within)
	}
	return err
}

func waitHTTP(t *testing.T, url string, p *proc) {
	t.Helper()
	testutil.WaitHTTP(t, p.Process, url, 0, 15*time.Second)
}

// sim is a running simserver.
type sim struct {
	addr string
	p    *proc
}

func startSim(t *testing.T, args ...string) *sim {
	t.Helper()
	addr := freeAddr(t)
	p := startProc(t, simserverBin, append([]string{"--listen", addr}, args...)...)
	waitHTTP(t, "http://"+addr+"/health", p)
	return &sim{addr: addr, p: p}
}

type simCounters struct {
	Active, PeakActive, Generating, PeakGenerating  int
	Requests, Completed, Cancelled, CancelledQueued int64
}

type simStats struct {
	simCounters
	Tenants  map[string]simCounters
	Arrivals []struct{ Tenant string }
}

func (s *sim) stats(t *testing.T) simStats {
	t.Helper()
	var st simStats
	testutil.GetJSON(t, "http://"+s.addr+"/debug/stats", "", &st)
	return st
}

// disp is a running dispatcher.
type disp struct {
	data, admin string
	token       string
	p           *proc
	dir         string
}

type dispOpts struct {
	policy *policy.Policy // written to --policy-file when set
	args   []string
}

const testToken = "test-admin-token"

func startDispatcher(t *testing.T, o dispOpts) *disp {
	t.Helper()
	d := &disp{data: freeAddr(t), admin: freeAddr(t), token: testToken, dir: t.TempDir()}
	tok := filepath.Join(d.dir, "token")
	if err := os.WriteFile(tok, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"dispatcher", "--listen", d.data, "--admin-listen", d.admin, "--admin-token-file", tok, "--log-format", "text", "-v", "1"}
	if o.policy != nil {
		f := filepath.Join(d.dir, "policy.json")
		writePolicy(t, f, o.policy)
		args = append(args, "--policy-file", f)
	}
	d.p = startProc(t, tiergateBin, append(args, o.args...)...)
	waitHTTP(t, "http://"+d.admin+"/healthz", d.p)
	return d
}

func (d *disp) policyFile() string { return filepath.Join(d.dir, "policy.json") }

func writePolicy(t *testing.T, path string, p *policy.Policy) {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// put pushes a policy through the admin API and returns status and body.
func (d *disp) put(t *testing.T, p *policy.Policy) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return d.adminDo(t, http.MethodPut, "/v1/policy", d.token, b)
}

func (d *disp) mustPut(t *testing.T, p *policy.Policy) {
	t.Helper()
	if code, body := d.put(t, p); code != http.StatusOK {
		t.Fatalf("PUT policy: %d %s", code, body)
	}
}

func (d *disp) adminDo(t *testing.T, method, path, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+d.admin+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// dispStats is the part of GET /v1/stats the tests read.
type dispStats struct {
	Queue struct {
		Slots, InFlight, Queued int
		Completed               uint64
		DoubleReleases          uint64
	} `json:"queue"`
	Backends []struct {
		Address     string `json:"address"`
		Outstanding int64  `json:"outstanding"`
	} `json:"backends"`
	Active int64 `json:"active"`
}

func (d *disp) stats(t *testing.T) dispStats {
	t.Helper()
	var s dispStats
	testutil.GetJSON(t, "http://"+d.admin+"/v1/stats", d.token, &s)
	return s
}

// scrape returns every sample of /metrics as "name{l1="v1",...}" -> value,
// labels sorted by name.
func (d *disp) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var lv []string
			for _, l := range m.GetLabel() {
				lv = append(lv, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := name + "{" + strings.Join(lv, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count{"+strings.Join(lv, ",")+"}"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// eventually retries cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyTrue(t, 10*time.Second, what, cond)
}

// basePolicy is a TrustedHeader policy with premium/standard/free tiers and
// the given backends.
func basePolicy(version int64, slots int, backends ...string) *policy.Policy {
	p := &policy.Policy{
		Version: version, Pool: "default/llm", Slots: slots, ServiceRate: 4, AgeingRate: 6, ClientTimeoutSeconds: 30,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		DefaultTier:    "free",
		ExemptPaths:    []string{"/health", "/v1/models"},
		Tiers: []policy.Tier{
			{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 20, TenantConcurrencyLimit: 6, TenantQueueLimit: 5},
			{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 80, TenantConcurrencyLimit: 2, TenantQueueLimit: 8},
			{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 240, TenantConcurrencyLimit: 1, TenantQueueLimit: 9},
		},
		Tenants: []policy.Tenant{{ID: "acme", Tier: "premium"}, {ID: "globex", Tier: "premium"}, {ID: "initech", Tier: "standard"}},
	}
	for _, b := range backends {
		p.Backends = append(p.Backends, policy.Backend{Address: b, Scheme: "http"})
	}
	return p
}

// call sends one data-port request.
type call struct {
	method, path, tenant, body string
	header                     http.Header
}

func (d *disp) do(ctx context.Context, t *testing.T, c call) (*http.Response, error) {
	t.Helper()
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.path == "" {
		c.path = "/v1/completions"
	}
	if c.body == "" && c.method == http.MethodPost {
		c.body = `{"model":"m","prompt":"hi"}`
	}
	req, err := http.NewRequestWithContext(ctx, c.method, "http://"+d.data+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	if c.tenant != "" {
		req.Header.Set("X-Tenant-ID", c.tenant)
	}
	return http.DefaultClient.Do(req)
}

// result is a finished data-port request.
type result struct {
	code   int
	header http.Header
	body   string
	err    error
}

func (d *disp) fetch(ctx context.Context, t *testing.T, c call) result {
	t.Helper()
	resp, err := d.do(ctx, t, c)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// refusal is the JSON body of a data-port refusal.
type refusal struct {
	Error struct {
		Type              string `json:"type"`
		Message           string `json:"message"`
		Tier              string `json:"tier"`
		QueuePosition     int    `json:"queue_position"`
		RetryAfterSeconds int    `json:"retry_after_seconds"`
	} `json:"error"`
}

func parseRefusal(t *testing.T, body string) refusal {
	t.Helper()
	var r refusal
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("refusal body %q: %v", body, err)
	}
	return r
}

// terminate sends SIGTERM and expects exit code 0.
func (d *disp) terminate(t *testing.T) {
	t.Helper()
	d.p.signal(t, syscall.SIGTERM)
	if err := d.p.wait(t, 20*time.Second); err != nil {
		t.Fatalf("dispatcher exit: %v\n%s", err, d.p.Output())
	}
}

func policyTier(name string, base int, wait float64, bound, conc, qlimit int) policy.Tier {
	return policy.Tier{Name: name, BasePriority: base, TolerableWaitSeconds: wait, QueueBound: bound,
		TenantConcurrencyLimit: conc, TenantQueueLimit: qlimit}
}

func tenant(id, tier string) policy.Tenant { return policy.Tenant{ID: id, Tier: tier} }
