package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// The chart's flags are only useful if the binary takes them: these tests
// run the real tiergate binary with the arguments the chart renders.

var tiergateBin = struct {
	once sync.Once
	path string
	err  error
}{}

// binary builds the tiergate binary once per test run.
func binary(t *testing.T) string {
	t.Helper()
	tiergateBin.once.Do(func() {
		tiergateBin.path = filepath.Join(helmHome, "bin", "tiergate")
		cmd := exec.Command("go", "build", "-o", tiergateBin.path, ".")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			tiergateBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if tiergateBin.err != nil {
		t.Fatal(tiergateBin.err)
	}
	return tiergateBin.path
}

var helpFlag = regexp.MustCompile(`(?m)^  -([a-z0-9][a-z0-9-]*)`)

// flagsOf lists the flags `tiergate <sub> --help` documents.
func flagsOf(t *testing.T, sub string) map[string]bool {
	t.Helper()
	r := run(t, nil, binary(t), sub, "--help")
	if r.err != nil {
		t.Fatalf("tiergate %s --help:\n%s", sub, r)
	}
	flags := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(r.stderr+r.stdout, -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("tiergate %s --help lists no flags:\n%s", sub, r)
	}
	return flags
}

// args returns a Deployment container's arguments.
func args(t *testing.T, deploy *unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, deploy)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

func TestChartFlagsExist(t *testing.T) {
	renders := map[string][]string{
		"default":     nil,
		"all-options": {"-f", filepath.Join("test", "helm", "testdata", "all-options.yaml")},
	}
	roles := map[string]string{"controller": "-controller", "dispatcher": "-dispatcher"}
	for rname, extra := range renders {
		objs := render(t, extra...)
		for role, suffix := range roles {
			t.Run(rname+"/"+role, func(t *testing.T) {
				known := flagsOf(t, role)
				var deploy *unstructured.Unstructured
				for _, o := range objs {
					if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), suffix) {
						deploy = o
					}
				}
				if deploy == nil {
					t.Fatalf("no %s Deployment rendered", role)
				}
				a := args(t, deploy)
				if a[0] != role {
					t.Fatalf("first argument %q, want the subcommand %q", a[0], role)
				}
				for _, arg := range a[1:] {
					name, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
					if !strings.HasPrefix(arg, "--") {
						t.Errorf("argument %q is not a --flag", arg)
						continue
					}
					if known[name] {
						continue
					}
					t.Errorf("the chart passes %q, but tiergate %s has no --%s", arg, role, name)
				}
			})
		}
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// rewrite replaces the value of the named flags in the chart's arguments.
func rewrite(t *testing.T, in []string, values map[string]string) []string {
	t.Helper()
	out := make([]string, 0, len(in))
	seen := map[string]bool{}
	for _, a := range in {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := values[name]; ok {
			a = "--" + name + "=" + v
			seen[name] = true
		}
		out = append(out, a)
	}
	for name := range values {
		if !seen[name] {
			t.Fatalf("the chart's arguments %v have no --%s to rewrite", in, name)
		}
	}
	return out
}

// process is a started tiergate subcommand; stop ends it.
type process struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{} // closed when the process has exited
	err    error         // its exit status, once done is closed
}

func start(t *testing.T, argv []string) *process {
	t.Helper()
	cmd := exec.Command(binary(t), argv...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, stderr: &stderr, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop(t *testing.T, within time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", p.err, p.stderr)
		}
	case <-time.After(within):
		t.Errorf("still running %v after SIGTERM\n%s", within, p.stderr)
	}
}

// eventually polls cond until it holds or the deadline passes; the process
// under test is real, so there is no clock to fake.
func eventually(t *testing.T, what string, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last: %s)", what, within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpDo(t *testing.T, method, url, token string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDispatcherRunsWithChartFlags(t *testing.T) {
	const token = "chart-flags-test-token-0123456789abcdef"
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	data, admin := freeAddr(t), freeAddr(t)
	chartArgs := args(t, find(t, render(t), "Deployment", "tiergate-dispatcher"))
	argv := rewrite(t, chartArgs, map[string]string{
		"listen":           data,
		"admin-listen":     admin,
		"admin-token-file": tokenFile,
	})
	p := start(t, argv)

	eventually(t, "/healthz answers 200", 20*time.Second, func() (bool, string) {
		code, body := httpDo(t, http.MethodGet, "http://"+admin+"/healthz", "", nil)
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
	if code, body := httpDo(t, http.MethodGet, "http://"+admin+"/readyz", "", nil); code == http.StatusOK {
		t.Errorf("/readyz = %d %q before any policy, want not ready", code, body)
	}

	pol := policy.Policy{
		Version: 1, Pool: "tg/llm", Slots: 4, ServiceRate: 1, AgeingRate: 6, ClientTimeoutSeconds: 30,
		Authentication: policy.Authentication{Mode: "TrustedHeader", HeaderName: "X-Tenant-ID"},
		Tiers:          []policy.Tier{{Name: "premium", TolerableWaitSeconds: 5, QueueBound: 5, TenantConcurrencyLimit: 1, TenantQueueLimit: 1}},
		Backends:       []policy.Backend{{Address: "127.0.0.1:1", Scheme: "http"}},
	}
	if err := pol.Validate(); err != nil {
		t.Fatalf("the test's policy is invalid: %v", err)
	}
	body, err := json.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	if code, resp := httpDo(t, http.MethodPut, "http://"+admin+"/v1/policy", "not-the-token", body); code != http.StatusUnauthorized {
		t.Errorf("PUT /v1/policy with a wrong token = %d %q, want 401", code, resp)
	}
	if code, resp := httpDo(t, http.MethodPut, "http://"+admin+"/v1/policy", token, body); code/100 != 2 {
		t.Fatalf("PUT /v1/policy with the mounted token = %d %q, want 2xx", code, resp)
	}
	eventually(t, "/readyz answers 200 with a policy", 10*time.Second, func() (bool, string) {
		code, body := httpDo(t, http.MethodGet, "http://"+admin+"/readyz", "", nil)
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
	p.stop(t, 40*time.Second) // the chart's drain timeout is 30s; nothing is queued
}

// The controller, run as the chart's ServiceAccount with the chart's flags,
// must lead, reconcile and write status with exactly the chart's RBAC.
func runControllerAsServiceAccount(t *testing.T, ns, release string) {
	t.Helper()
	manifest := helmKube(t, "get", "manifest", release, "--namespace", ns)
	objs := parseDocs(t, manifest)
	deploy := find(t, objs, "Deployment", release+"-tiergate-controller")
	sa := "system:serviceaccount:" + ns + ":" + field[string](t, deploy, "spec", "template", "spec", "serviceAccountName")

	// A kubeconfig that impersonates the ServiceAccount.
	cfg, err := clientcmd.LoadFromFile(controlPlane(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = sa
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(pushToken(t, ns, release+"-tiergate-push-token", "token")), 0o600); err != nil {
		t.Fatal(err)
	}
	probe, metricsAddr := freeAddr(t), freeAddr(t)
	argv := rewrite(t, args(t, deploy), map[string]string{
		"metrics-bind-address":      metricsAddr,
		"health-probe-bind-address": probe,
		"push-token-file":           tokenFile,
	})
	argv = append(argv, "--kubeconfig="+kubeconfig)
	p := start(t, argv)

	eventually(t, "controller /readyz answers 200", 60*time.Second, func() (bool, string) {
		code, body := httpDo(t, http.MethodGet, "http://"+probe+"/readyz", "", nil)
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
	cs := adminClientset(t)
	eventually(t, "the controller holds its Lease", 30*time.Second, func() (bool, string) {
		l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "tiergate-controller.tiergate.dev", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", "no holder"
	})
	dyn, err := dynamic.NewForConfig(cp.admin)
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(schema.GroupVersionResource{Group: "tiergate.dev", Version: "v1alpha1", Resource: "modelpools"})
	eventually(t, "the sample ModelPool gets status conditions", 30*time.Second, func() (bool, string) {
		mp, err := pools.Namespace(ns).Get(context.Background(), "llm", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(mp.Object, "status", "conditions")
		return len(conds) > 0, fmt.Sprintf("status %v", mp.Object["status"])
	})

	// With the sample's 6 ready replicas the tiers state their guarantees
	// (DESIGN.md section 4: 61s, 121s, 181s), and /metrics serves them with
	// the pool label the dispatchers use, for the chart's alert to join on.
	kubectl(t, "patch", "deployment", "llm", "--namespace", ns, "--subresource=status", "--type=merge",
		"-p", `{"status":{"replicas":6,"readyReplicas":6}}`)
	want := map[string]float64{"premium": 61, "standard": 121, "free": 181}
	eventually(t, "the controller exports the tiers' stated maxWait", 30*time.Second, func() (bool, string) {
		code, body := httpDo(t, http.MethodGet, "http://"+metricsAddr+"/metrics", "", nil)
		if code != http.StatusOK {
			return false, fmt.Sprintf("GET /metrics: %d", code)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			return false, err.Error()
		}
		got := map[string]float64{}
		for name := range controllerExported {
			f, ok := families[name]
			if !ok {
				return false, name + " not served"
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				names, wantNames := slices.Sorted(maps.Keys(labels)), slices.Sorted(maps.Keys(controllerExported[name]))
				if !slices.Equal(names, wantNames) {
					return false, fmt.Sprintf("%s has labels %v, want %v", name, names, wantNames)
				}
				if name == "tiergate_tier_max_wait_seconds" && labels["pool"] == ns+"/llm" {
					got[labels["tier"]] = m.GetGauge().GetValue()
				}
			}
		}
		return cmp.Equal(want, got), fmt.Sprintf("tiergate_tier_max_wait_seconds{pool=%q} by tier: %v, want %v", ns+"/llm", got, want)
	})
	p.stop(t, 20*time.Second)
	if logs := p.stderr.String(); regexp.MustCompile(`(?i)forbidden`).MatchString(logs) {
		t.Errorf("the controller was refused something its role should allow:\n%s", logs)
	}
	l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "tiergate-controller.tiergate.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after a clean stop (release on cancel needs update)", *h)
	}
}

// The chart's fleet-mode flags, run: a real redis-server with a password,
// the chart's --state URL, password file, lease TTL and renewal interval.
// The dispatcher's registration in Redis shows the TTL (its lease expires
// at most 2s after Redis' clock, against 10s by default) and the interval
// (renewed about every 200ms, against 667ms by default for that TTL).
func TestDispatcherRunsWithChartFleetFlags(t *testing.T) {
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found: install it with `hack/ensure-deb.sh redis-server` (%v)", err)
	}
	const token = "chart-fleet-test-token-0123456789abcdef"
	const password = "fleet-test-password"
	dir := t.TempDir()
	tokenFile, pwFile := filepath.Join(dir, "token"), filepath.Join(dir, "password")
	for f, v := range map[string]string{tokenFile: token, pwFile: password + "\n"} {
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	redisAddr := freeAddr(t)
	host, port, _ := net.SplitHostPort(redisAddr)
	redisLog := filepath.Join(dir, "redis.log")
	srv := exec.Command(redisBin, "--bind", host, "--port", port, "--requirepass", password,
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", redisLog)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, Password: password})
	t.Cleanup(func() { _ = rdb.Close() })
	eventually(t, "redis-server answers PING", 10*time.Second, func() (bool, string) {
		err := rdb.Ping(context.Background()).Err()
		log, _ := os.ReadFile(redisLog)
		return err == nil, fmt.Sprintf("%v\n%s", err, log)
	})

	d := find(t, render(t, "--set", "redis.enabled=true,redis.address="+redisAddr+",redis.passwordSecret.name=redis-auth,redis.leaseTTLSeconds=2",
		"--set-json", "redis.renewIntervalSeconds=0.2"), "Deployment", "tiergate-dispatcher")
	chartArgs := args(t, d)
	for _, want := range []string{"--state=redis://" + redisAddr + "/0", "--state-lease-ttl=2s", "--state-renew-interval=0.2s"} {
		if !slices.Contains(chartArgs, want) {
			t.Fatalf("the chart's arguments %v lack %s", chartArgs, want)
		}
	}
	data, admin := freeAddr(t), freeAddr(t)
	p := start(t, rewrite(t, chartArgs, map[string]string{
		"listen":              data,
		"admin-listen":        admin,
		"admin-token-file":    tokenFile,
		"redis-password-file": pwFile,
	}))
	eventually(t, "/healthz answers 200", 20*time.Second, func() (bool, string) {
		code, body := httpDo(t, http.MethodGet, "http://"+admin+"/healthz", "", nil)
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})

	pol := policy.Policy{
		Version: 1, Pool: "tg/llm", Slots: 4, ServiceRate: 1, AgeingRate: 6, ClientTimeoutSeconds: 30, SharedState: policy.StateRedis,
		Authentication: policy.Authentication{Mode: "TrustedHeader", HeaderName: "X-Tenant-ID"},
		Tiers:          []policy.Tier{{Name: "premium", TolerableWaitSeconds: 5, QueueBound: 5, TenantConcurrencyLimit: 1, TenantQueueLimit: 1}},
		Backends:       []policy.Backend{{Address: "127.0.0.1:1", Scheme: "http"}},
	}
	if err := pol.Validate(); err != nil {
		t.Fatalf("the test's policy is invalid: %v", err)
	}
	body, err := json.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	if code, resp := httpDo(t, http.MethodPut, "http://"+admin+"/v1/policy", token, body); code/100 != 2 {
		t.Fatalf("PUT /v1/policy = %d %q, want 2xx", code, resp)
	}

	// registration returns the dispatcher's lease expiry and how far it
	// lies ahead of Redis' clock, in milliseconds; ok is false while the
	// dispatcher is not registered.
	const key = "tg:{tg/llm}:dispatchers"
	ctx := context.Background()
	registration := func() (expiry, lead float64, ok bool, err error) {
		members, err := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil || len(members) == 0 {
			return 0, 0, false, err
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return 0, 0, false, err
		}
		return members[0].Score, members[0].Score - float64(now.UnixMilli()), true, nil
	}
	eventually(t, "the dispatcher registers in Redis", 10*time.Second, func() (bool, string) {
		_, _, ok, err := registration()
		return ok, fmt.Sprintf("no member in %s (err %v)", key, err)
	})
	expiries := map[float64]bool{}
	var maxLead float64
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		expiry, lead, ok, err := registration()
		if err != nil || !ok {
			t.Fatalf("the registration vanished: ok %v, err %v", ok, err)
		}
		maxLead = max(maxLead, lead)
		expiries[expiry] = true
	}
	if maxLead > 2000 || maxLead <= 0 {
		t.Errorf("the registration expires up to %.0fms after Redis' clock, want within the chart's 2s lease TTL", maxLead)
	}
	// 2s at 200ms is 10 renewals; the default interval for a 2s TTL
	// (667ms) gives 3 or 4.
	if len(expiries) < 6 {
		t.Errorf("the registration was renewed %d times in 2s, want at least 6 with the chart's 0.2s interval", len(expiries))
	}
	p.stop(t, 40*time.Second)
}
