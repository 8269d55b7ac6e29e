package dispatcher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/budget"
	"github.com/tiergate/tiergate/internal/testutil"
)

const mib = 1 << 20

// floodPolicy has one tier whose bound and tenant limits are far above
// what the body budget lets queue, so the budget is what refuses.
func floodPolicy(slots int, backend string) *policy.Policy {
	p := basePolicy(1, slots, backend)
	p.Tiers = []policy.Tier{policyTier("free", 0, 60, 500, slots, 500)}
	p.Tenants = nil
	return p
}

// jsonBody is a completion request of exactly n bytes.
func jsonBody(n int) []byte {
	head, tail := `{"model":"m","max_tokens":1,"prompt":"`, `"}`
	return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
}

// memoryKiB reads a /proc/<pid>/status field (VmHWM: peak RSS, VmRSS).
func memoryKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// The refusal of a body the budget has no room for, exactly: one queued
// request holds 600 KB of a 1 MiB budget, the next one declares 600 KB.
// Once the load is gone the budget is back to 0.
func TestOverloadedRefusal(t *testing.T) {
	s := startSim(t, "--concurrency", "1", "--service-time", "const:1s")
	d := startDispatcher(t, dispOpts{policy: floodPolicy(1, s.Addr), args: []string{"--max-body-bytes", "1048576", "--max-queued-bytes", "1048576"}})
	ctx := context.Background()
	background(t, d, call{tenant: "a"}) // holds the slot for 1s
	testutil.EventuallyTrue(t, settle, "the slot taken", func() bool { return d.stats(t).Queue.InFlight == 1 })
	queued := make(chan result, 1)
	go func() { queued <- d.fetch(ctx, t, call{tenant: "b", body: string(jsonBody(600_000))}) }()
	testutil.EventuallyTrue(t, settle, "600 KB queued", func() bool { st := d.stats(t); return st.Queue.Queued == 1 && st.QueuedBodyBytes == 600_000 })

	resp, err := d.do(ctx, t, call{tenant: "c", body: string(jsonBody(600_000))})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkRefusal(t, result{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}, wantRefusal{code: 503, typ: "overloaded", tier: "free", retryAfter: 1,
		msg: "queued request bodies would exceed the dispatcher's 1 MiB budget (--max-queued-bytes); retry shortly or on another instance"})
	if !resp.Close {
		t.Error("the connection is kept open, but the body was not read: want Connection: close")
	}
	if r := <-queued; r.err != nil || r.code != 200 {
		t.Fatalf("the queued request: %d %v %s", r.code, r.err, r.body)
	}
	testutil.EventuallyTrue(t, settle, "the budget back to 0", func() bool { return d.stats(t).QueuedBodyBytes == 0 })
	m := d.Metrics(t)
	want := map[string]float64{
		`tiergate_rejections_total{cause="overloaded",pool="default/llm",tier="free"}`: 1,
		`tiergate_queued_body_bytes{pool="default/llm"}`:                               0,
		`tiergate_queued_body_budget_bytes{pool="default/llm"}`:                        mib,
	}
	got2 := map[string]float64{}
	for k := range want {
		got2[k] = m[k]
	}
	if diff := cmp.Diff(want, got2); diff != "" {
		t.Errorf("metrics (-want +got)\n%s", diff)
	}
}

// The budget's default comes from the memory limits the process knows,
// as its log says; a budget below --max-body-bytes is refused at start.
func TestBodyBudgetDefault(t *testing.T) {
	cgroup := budget.CgroupLimit(os.DirFS("/"))
	t.Logf("this machine's cgroup memory limit: %d bytes (0: none)", cgroup)
	for name, tc := range map[string]struct {
		env, args []string
		limit     int64 // the smallest limit the case sets (0: none); skipped if the cgroup's is smaller
		want      string
		wantSoft  string // the soft memory limit line, "" for none
	}{
		"no limit known": {want: `"bytes"=268435456 "from"="no memory limit is known (GOMEMLIMIT, --memory-limit, cgroup): 256 MiB"`},
		"GOMEMLIMIT": {env: []string{"GOMEMLIMIT=400MiB"}, limit: 400 * mib,
			want: `"bytes"=104857600 "from"="a quarter of GOMEMLIMIT (400 MiB)"`},
		"the container's limit, as the chart passes it": {args: []string{"--memory-limit", "536870912"}, limit: 512 * mib,
			want: `"bytes"=134217728 "from"="a quarter of --memory-limit (512 MiB)"`, wantSoft: `"bytes"=483183821`},
		"GOMEMLIMIT below the container's": {env: []string{"GOMEMLIMIT=256MiB"}, args: []string{"--memory-limit", "536870912"}, limit: 256 * mib,
			want: `"bytes"=67108864 "from"="a quarter of GOMEMLIMIT (256 MiB)"`},
		"the flag": {args: []string{"--max-queued-bytes", "8388608", "--memory-limit", "536870912"}, limit: 512 * mib,
			want: `"bytes"=8388608 "from"="--max-queued-bytes"`, wantSoft: `"bytes"=483183821`},
	} {
		t.Run(name, func(t *testing.T) {
			if cgroup > 0 && (tc.limit == 0 || cgroup < tc.limit) {
				t.Skipf("the cgroup's limit (%d) decides on this machine", cgroup)
			}
			d := testutil.StartDispatcher(t, bins.Tiergate, testutil.DispatcherOptions{Env: tc.env, Args: tc.args})
			line := func(msg string) string {
				for _, l := range strings.Split(d.Output(), "\n") {
					if strings.Contains(l, `"msg"="`+msg+`"`) {
						return l
					}
				}
				return ""
			}
			if l := line("queued body budget"); !strings.Contains(l, tc.want) {
				t.Errorf("log line %q, want it to hold %s", l, tc.want)
			}
			if l := line("set the Go soft memory limit"); (tc.wantSoft == "") != (l == "") || !strings.Contains(l, tc.wantSoft) {
				t.Errorf("soft limit line %q, want %q", l, tc.wantSoft)
			}
			var st struct {
				QueuedBodyBudget int64 `json:"queuedBodyBudget"`
			}
			d.Stats(t, &st)
			if want, _ := strconv.ParseInt(strings.Fields(strings.TrimPrefix(tc.want, `"bytes"=`))[0], 10, 64); st.QueuedBodyBudget != want {
				t.Errorf("stats queuedBodyBudget %d, want %d", st.QueuedBodyBudget, want)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bins.Tiergate, "dispatcher", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--max-body-bytes", "8388608", "--max-queued-bytes", "4194304").CombinedOutput()
	if code, _ := testutil.ExitCode(err); code != 2 || !bytes.Contains(out, []byte("--max-queued-bytes (4 MiB) must be at least --max-body-bytes (8 MiB): a body of the largest size would never fit")) {
		t.Errorf("a budget below the largest body: exit %d, output:\n%s", code, out)
	}
}

// floodCounts are the answers of a flood, by outcome.
type floodCounts struct {
	Served, Capacity, Overloaded, Other, Errors int
}

// flood sends n requests with body from each of clients goroutines and
// counts the answers; it gives up after limit.
func flood(t *testing.T, d *disp, clients, n int, body []byte, limit time.Duration) (floodCounts, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var mu sync.Mutex
	var c floodCounts
	var samples []string
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(tenant string) {
			defer wg.Done()
			for j := 0; j < n && ctx.Err() == nil; j++ {
				code, typ, err := floodOne(ctx, client, d.DataURL("/v1/completions"), tenant, body)
				mu.Lock()
				switch {
				case err != nil:
					c.Errors++
					samples = append(samples, err.Error())
				case code == 200:
					c.Served++
				case code == 429 && typ == "capacity":
					c.Capacity++
				case code == 503 && typ == "overloaded":
					c.Overloaded++
				default:
					c.Other++
					samples = append(samples, fmt.Sprintf("%d %s", code, typ))
				}
				mu.Unlock()
			}
		}(fmt.Sprintf("t%d", i))
	}
	wg.Wait()
	return c, samples
}

func floodOne(ctx context.Context, client *http.Client, url, tenant string, body []byte) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Tenant-ID", tenant)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	if resp.StatusCode == http.StatusOK {
		return 200, "", nil
	}
	var r testutil.Refusal
	if err := json.Unmarshal(b, &r); err != nil {
		return resp.StatusCode, "", fmt.Errorf("%d with a body that is not a refusal: %w", resp.StatusCode, err)
	}
	return resp.StatusCode, r.Error.Type, nil
}

// A flood of large bodies against a dispatcher configured as the chart
// configures one with a 128 MiB memory limit (--memory-limit: a budget of
// a quarter, 32 MiB, and a Go soft limit of 90%) in front of a slow
// backend. Every request is answered (served, 429 or 503 overloaded), the
// budget refuses what would not fit and is back to 0 afterwards, and the
// peak RSS (VmHWM) stays within the budget plus a stated overhead: the
// process at rest (mostly the binary's mapped pages), the collector's
// headroom (GOGC=100 lets the heap grow to twice what is live, and what is
// live is at most the budget plus the bodies in flight, slots ×
// --max-body-bytes), and 16 MiB for connections and stacks. It also stays
// below the memory limit, which is what keeps the kernel from killing it.
func TestBodyFlood(t *testing.T) {
	if testutil.RaceRequested() {
		t.Skip("the race detector's shadow memory makes RSS meaningless")
	}
	const limitMiB, budgetMiB, slots, clients, perClient, bodyBytes = 128, 32, 4, 96, 8, 1_000_000
	s := startSim(t, "--concurrency", strconv.Itoa(slots), "--service-time", "const:200ms")
	d := startDispatcher(t, dispOpts{policy: floodPolicy(slots, s.Addr), args: []string{
		"--max-body-bytes", strconv.Itoa(mib), "--memory-limit", strconv.Itoa(limitMiB * mib)}})
	if st := d.stats(t); st.QueuedBodyBudget != budgetMiB*mib {
		t.Fatalf("budget %d, want a quarter of the memory limit, %d MiB", st.QueuedBodyBudget, budgetMiB)
	}
	rest := memoryKiB(t, d.Pid(), "VmHWM")
	body := jsonBody(bodyBytes)

	start := time.Now()
	c, samples := flood(t, d, clients, perClient, body, 90*time.Second)
	took := time.Since(start)
	peak := memoryKiB(t, d.Pid(), "VmHWM")
	inflightMiB := int64(slots) // slots × 1 MiB
	overhead := rest + (budgetMiB+2*inflightMiB+16)*1024
	t.Logf("%d clients × %d requests of %d bytes in %s: %+v", clients, perClient, bodyBytes, took.Round(time.Millisecond), c)
	t.Logf("peak RSS %.1f MiB against a budget of %d MiB: allowed %d MiB + %.1f MiB (at rest %.1f MiB, collector headroom %d MiB, in flight 2 × %d MiB, 16 MiB); memory limit %d MiB",
		float64(peak)/1024, budgetMiB, budgetMiB, float64(overhead)/1024, float64(rest)/1024, budgetMiB, inflightMiB, limitMiB)
	if c.Errors+c.Other > 0 || c.Served+c.Capacity+c.Overloaded != clients*perClient {
		t.Errorf("not every request got an answer: %+v; e.g. %q", c, samples[:min(len(samples), 5)])
	}
	if c.Overloaded == 0 || c.Served == 0 {
		t.Errorf("the flood did not exercise the budget: %+v", c)
	}
	if peak > budgetMiB*1024+overhead || peak > limitMiB*1024 {
		t.Errorf("peak RSS %d KiB > budget %d MiB + overhead %d KiB, or > the limit %d MiB", peak, budgetMiB, overhead, limitMiB)
	}
	testutil.EventuallyTrue(t, settle, "the budget back to 0", func() bool { return d.stats(t).QueuedBodyBytes == 0 })
	m := d.Metrics(t)
	if got := m[`tiergate_rejections_total{cause="overloaded",pool="default/llm",tier="free"}`]; int(got) != c.Overloaded {
		t.Errorf("rejections_total{cause=overloaded} = %v, the clients saw %d", got, c.Overloaded)
	}
	if got := m[`tiergate_requests_total{code="200",pool="default/llm",tier="free"}`]; int(got) != c.Served {
		t.Errorf("requests_total{code=200} = %v, the clients saw %d", got, c.Served)
	}
}
