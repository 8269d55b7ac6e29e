package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
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

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
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
		tiergateBin.err = testutil.BuildBinary(repoRoot, tiergateBin.path, ".", testutil.BuildOptions{})
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
	r := command(testutil.Tool{Bin: binary(t)}).Run(sub, "--help")
	if r.Err != nil {
		t.Fatalf("tiergate %s --help:\n%s", sub, r)
	}
	flags := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(r.Stderr+r.Stdout, -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("tiergate %s --help lists no flags:\n%s", sub, r)
	}
	return flags
}

// args returns a Deployment container's arguments, with the $(VAR)
// references of its env expanded as the kubelet does (expandEnv).
func args(t *testing.T, deploy *unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, deploy)["args"].([]any) {
		out = append(out, a.(string))
	}
	return expandEnv(t, container(t, deploy), out)
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

// start runs the tiergate binary with argv for t (see testutil.StartT).
func start(t *testing.T, argv []string) *testutil.Process {
	t.Helper()
	return testutil.StartT(t, exec.Command(binary(t), argv...), testutil.Options{Name: "tiergate " + argv[0]})
}

// chartPolicy is a valid one-tier policy for the dispatchers the chart's
// flags start, in sharedState (Local when "").
func chartPolicy(t *testing.T, sharedState string) []byte {
	t.Helper()
	pol := policy.Policy{
		Version: 1, Pool: "tg/llm", Slots: 4, ServiceRate: 1, AgeingRate: 6, ClientTimeoutSeconds: 30, SharedState: sharedState,
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
	return body
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
	data, admin := testutil.FreeAddr(t, "127.0.0.1"), testutil.FreeAddr(t, "127.0.0.1")
	chartArgs := args(t, find(t, render(t), "Deployment", "tiergate-dispatcher"))
	argv := rewrite(t, chartArgs, map[string]string{
		"listen":           data,
		"admin-listen":     admin,
		"admin-token-file": tokenFile,
	})
	p := start(t, argv)

	testutil.WaitHTTP(t, p, "http://"+admin+"/healthz", http.StatusOK, 20*time.Second)
	if code, body := httpDo(t, http.MethodGet, "http://"+admin+"/readyz", "", nil); code == http.StatusOK {
		t.Errorf("/readyz = %d %q before any policy, want not ready", code, body)
	}

	body := chartPolicy(t, "")
	if code, resp := httpDo(t, http.MethodPut, "http://"+admin+"/v1/policy", "not-the-token", body); code != http.StatusUnauthorized {
		t.Errorf("PUT /v1/policy with a wrong token = %d %q, want 401", code, resp)
	}
	if code, resp := httpDo(t, http.MethodPut, "http://"+admin+"/v1/policy", token, body); code/100 != 2 {
		t.Fatalf("PUT /v1/policy with the mounted token = %d %q, want 2xx", code, resp)
	}
	// The policy is applied before the PUT answers.
	if code, resp := httpDo(t, http.MethodGet, "http://"+admin+"/readyz", "", nil); code != http.StatusOK {
		t.Errorf("/readyz with a policy = %d %q, want 200", code, resp)
	}
	p.StopClean(t, 40*time.Second) // the chart's drain timeout is 30s; nothing is queued
}

// The controller, run as the chart's ServiceAccount with the chart's flags,
// must lead, reconcile and write status with exactly the chart's RBAC.
func runControllerAsServiceAccount(t *testing.T, ns, release string) {
	t.Helper()
	manifest := helmKube(t, "get", "manifest", release, "--namespace", ns)
	objs := parseDocs(t, manifest)
	deploy := find(t, objs, "Deployment", release+"-tiergate-controller")
	sa := "system:serviceaccount:" + ns + ":" + field[string](t, deploy, "spec", "template", "spec", "serviceAccountName")

	kubeconfig := impersonating(t, ns, sa)
	dir := t.TempDir()
	// The controller creates the token Secret; its optional volume stays
	// empty here (no kubelet fills it in).
	tokenFile := filepath.Join(dir, "push-token", "token")
	probe, metricsAddr := testutil.FreeAddr(t, "127.0.0.1"), testutil.FreeAddr(t, "127.0.0.1")
	argv := rewrite(t, args(t, deploy), map[string]string{
		"metrics-bind-address":      metricsAddr,
		"health-probe-bind-address": probe,
		"push-token-file":           tokenFile,
	})
	argv = append(argv, "--kubeconfig="+kubeconfig)
	p := start(t, argv)

	testutil.WaitHTTP(t, p, "http://"+probe+"/readyz", http.StatusOK, 60*time.Second)
	cs := adminClientset(t)
	testutil.Eventually(t, 30*time.Second, "the controller holds its Lease", func() error {
		l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "tiergate-controller.tiergate.dev", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return errors.New("no holder")
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, "the controller creates the push token Secret", func() error {
		sec, err := cs.CoreV1().Secrets(ns).Get(context.Background(), release+"-tiergate-push-token", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if by := sec.Labels["app.kubernetes.io/managed-by"]; by != "tiergate-controller" || len(sec.Data["token"]) != 48 {
			return fmt.Errorf("managed by %q, token of %d bytes", by, len(sec.Data["token"]))
		}
		return nil
	})
	dyn, err := dynamic.NewForConfig(cp.admin)
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(schema.GroupVersionResource{Group: "tiergate.dev", Version: "v1alpha1", Resource: "modelpools"})
	testutil.Eventually(t, 30*time.Second, "the sample ModelPool gets status conditions", func() error {
		mp, err := pools.Namespace(ns).Get(context.Background(), "llm", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if conds, _, _ := unstructured.NestedSlice(mp.Object, "status", "conditions"); len(conds) == 0 {
			return fmt.Errorf("status %v", mp.Object["status"])
		}
		return nil
	})

	// With the sample's 6 ready replicas the tiers state their guarantees
	// (docs/architecture.md#the-queue: 61s, 121s, 181s), and /metrics serves them with
	// the pool label the dispatchers use, for the chart's alert to join on.
	// The pool counts the Ready pods it lists (at most readyReplicas): the
	// sample Deployment's six, made by the ReplicaSet controller and played
	// by kwok, with readyReplicas as the Deployment controller reports it.
	startCluster(t)
	clusterUp := time.Now()
	defer func() {
		t.Logf("from the cluster's start to the controller's clean stop: %s", time.Since(clusterUp).Round(time.Millisecond))
	}()
	testutil.Eventually(t, 60*time.Second, "the sample Deployment reports 6 ready replicas", func() error {
		d, err := cs.AppsV1().Deployments(ns).Get(context.Background(), "llm", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != 6 {
			return fmt.Errorf("status %+v", d.Status)
		}
		return nil
	})
	want := map[string]float64{"premium": 61, "standard": 121, "free": 181}
	testutil.Eventually(t, 30*time.Second, "the controller exports the tiers' stated maxWait", func() error {
		code, body := httpDo(t, http.MethodGet, "http://"+metricsAddr+"/metrics", "", nil)
		if code != http.StatusOK {
			return fmt.Errorf("GET /metrics: %d", code)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			return err
		}
		got := map[string]float64{}
		for name := range controllerExported {
			f, ok := families[name]
			if !ok {
				return errors.New(name + " not served")
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				names, wantNames := slices.Sorted(maps.Keys(labels)), slices.Sorted(maps.Keys(controllerExported[name]))
				if !slices.Equal(names, wantNames) {
					return fmt.Errorf("%s has labels %v, want %v", name, names, wantNames)
				}
				if name == "tiergate_tier_max_wait_seconds" && labels["pool"] == ns+"/llm" {
					got[labels["tier"]] = m.GetGauge().GetValue()
				}
			}
		}
		if !cmp.Equal(want, got) {
			return fmt.Errorf("tiergate_tier_max_wait_seconds{pool=%q} by tier: %v, want %v", ns+"/llm", got, want)
		}
		return nil
	})
	p.StopClean(t, 20*time.Second)
	if logs := p.Output(); regexp.MustCompile(`(?i)forbidden`).MatchString(logs) {
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

// impersonating writes a kubeconfig of the control plane's admin that
// impersonates the ServiceAccount user sa of namespace ns, so requests are
// authorized as that ServiceAccount.
func impersonating(t *testing.T, ns, sa string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(controlPlane(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = sa
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// The chart's fleet-mode flags, run: a real redis-server with a password,
// the chart's --state URL, password file, lease TTL and renewal interval.
// The dispatcher's registration in Redis shows the TTL (its lease expires
// at most 2s after Redis' clock, against 10s by default) and the interval
// (renewed about every 200ms, against 667ms by default for that TTL).
// Every renewal is a ZADD to the registration, which Redis announces as a
// keyspace event: the test reads the lease at each one.
func TestDispatcherRunsWithChartFleetFlags(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
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
	rs := redistest.Start(t, redistest.Options{Password: password, Extra: []string{"--notify-keyspace-events", "Kz"}})
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), Password: password})
	t.Cleanup(func() { _ = rdb.Close() })
	const key = "tg:{tg/llm}:dispatchers"
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, "__keyspace@0__:"+key)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatalf("subscribing to the registration's events: %v", err)
	}
	events := sub.Channel()

	d := find(t, render(t, "--set", "redis.enabled=true,redis.address="+rs.Addr()+",redis.passwordSecret.name=redis-auth,redis.leaseTTLSeconds=2",
		"--set-json", "redis.renewIntervalSeconds=0.2"), "Deployment", "tiergate-dispatcher")
	chartArgs := args(t, d)
	for _, want := range []string{"--state=redis://" + rs.Addr() + "/0", "--state-lease-ttl=2s", "--state-renew-interval=0.2s"} {
		if !slices.Contains(chartArgs, want) {
			t.Fatalf("the chart's arguments %v lack %s", chartArgs, want)
		}
	}
	admin := testutil.FreeAddr(t, "127.0.0.1")
	p := start(t, rewrite(t, chartArgs, map[string]string{
		"listen":              testutil.FreeAddr(t, "127.0.0.1"),
		"admin-listen":        admin,
		"admin-token-file":    tokenFile,
		"redis-password-file": pwFile,
	}))
	testutil.WaitHTTP(t, p, "http://"+admin+"/healthz", http.StatusOK, 20*time.Second)
	if code, resp := httpDo(t, http.MethodPut, "http://"+admin+"/v1/policy", token, chartPolicy(t, policy.StateRedis)); code/100 != 2 {
		t.Fatalf("PUT /v1/policy = %d %q, want 2xx", code, resp)
	}

	// lead is how far the registration's expiry lies ahead of Redis'
	// clock, in milliseconds.
	lead := func() float64 {
		members, err := rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil || len(members) != 1 {
			t.Fatalf("the registration: %v, %v; want one member", members, err)
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return members[0].Score - float64(now.UnixMilli())
	}
	// Seven renewals are six intervals: 1.2s at the chart's 0.2s, 4s at
	// the default 667ms for a 2s TTL.
	var renewals []time.Time
	var maxLead float64
	timeout := time.After(30 * time.Second)
	for len(renewals) < 7 {
		select {
		case msg := <-events:
			if msg.Payload == "zadd" {
				renewals = append(renewals, time.Now())
				maxLead = max(maxLead, lead())
			}
		case <-timeout:
			t.Fatalf("%d renewals of the registration within 30s, want 7", len(renewals))
		}
	}
	if maxLead > 2000 || maxLead <= 0 {
		t.Errorf("the registration expires up to %.0fms after Redis' clock, want within the chart's 2s lease TTL", maxLead)
	}
	took := renewals[6].Sub(renewals[0])
	t.Logf("six renewal intervals took %s; the lease led Redis' clock by at most %.0fms", took, maxLead)
	if took > 6*400*time.Millisecond {
		t.Errorf("six renewal intervals took %s, want about 1.2s with the chart's 0.2s interval", took)
	}
	p.StopClean(t, 40*time.Second)
}
