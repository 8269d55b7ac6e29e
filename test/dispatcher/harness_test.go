package dispatcher

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher"
	"github.com/tiergate/tiergate/internal/testutil"
)

// bins are the binaries under test, built by TestMain.
var bins testutil.Binaries

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tiergate-dispatcher-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// With TIERGATE_TEST_RACE the binaries under test run with the race
	// detector.
	bins, err = testutil.BuildBinaries(dir, testutil.BuildOptions{Race: testutil.RaceRequested()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// settle bounds every wait for the processes to reach a state.
const settle = 10 * time.Second

// startSim starts a simserver with args.
func startSim(t *testing.T, args ...string) *testutil.Simserver {
	t.Helper()
	return testutil.StartSimserver(t, bins.Simserver, testutil.SimOptions{Args: args})
}

// disp is a running dispatcher.
type disp struct{ *testutil.Dispatcher }

type dispOpts struct {
	policy *policy.Policy // written to --policy-file when set
	args   []string
}

const testToken = "test-admin-token"

// startDispatcher starts a dispatcher, logging at -v 1, with testToken.
func startDispatcher(t *testing.T, o dispOpts) *disp {
	t.Helper()
	do := testutil.DispatcherOptions{Token: testToken, Args: append([]string{"-v", "1"}, o.args...)}
	if o.policy != nil {
		do.Policy = o.policy
	}
	return &disp{testutil.StartDispatcher(t, bins.Tiergate, do)}
}

func (d *disp) stats(t *testing.T) dispatcher.Stats {
	t.Helper()
	var s dispatcher.Stats
	d.Stats(t, &s)
	return s
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
	req, err := http.NewRequestWithContext(ctx, c.method, d.DataURL(c.path), strings.NewReader(c.body))
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

func policyTier(name string, base int, wait float64, bound, conc, qlimit int) policy.Tier {
	return policy.Tier{Name: name, BasePriority: base, TolerableWaitSeconds: wait, QueueBound: bound,
		TenantConcurrencyLimit: conc, TenantQueueLimit: qlimit}
}

func tenant(id, tier string) policy.Tenant { return policy.Tenant{ID: id, Tier: tier} }
