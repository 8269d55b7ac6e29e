package helm

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/internal/testutil"
)

// promtool comes from the Debian package prometheus.
func promtool(t *testing.T) testutil.Tool {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found: install it with `hack/ensure-deb.sh prometheus` (%v)", err)
	}
	return command(testutil.Tool{Bin: p})
}

// ruleFile renders the PrometheusRule and writes its spec as a Prometheus
// rule file.
func ruleFile(t *testing.T, extra ...string) (path string, groups []any) {
	t.Helper()
	objs := render(t, extra...)
	var rule map[string]any
	for _, o := range objs {
		if o.GetKind() == "PrometheusRule" {
			rule = o.Object["spec"].(map[string]any)
		}
	}
	if rule == nil {
		t.Fatalf("no PrometheusRule rendered with %v", extra)
	}
	data, err := yaml.Marshal(rule)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, rule["groups"].([]any)
}

func TestRulesPassPromtoolCheck(t *testing.T) {
	tests := map[string][]string{
		"defaults": {"--set", "metrics.prometheusRule.enabled=true"},
		"per-tier guarantees": {"--set", "metrics.prometheusRule.enabled=true," +
			"metrics.prometheusRule.oldestQueuedAge.maxWaitSecondsByTier.premium=30," +
			"metrics.prometheusRule.oldestQueuedAge.maxWaitSecondsByTier.free\\.v2=200"},
		"all options": {"-f", filepath.Join("test", "helm", "testdata", "all-options.yaml")},
	}
	for name, extra := range tests {
		t.Run(name, func(t *testing.T) {
			path, _ := ruleFile(t, extra...)
			r := promtool(t).Run("check", "rules", path)
			if r.Err != nil {
				t.Fatalf("promtool check rules:\n%s", r)
			}
			if !strings.Contains(r.Stdout, "SUCCESS: 4 rules found") {
				t.Errorf("promtool check rules did not find the 4 alerts:\n%s", r)
			}
		})
	}
}

// alertTests feeds synthetic series to the rendered alerts (namespace
// tiergate-system; values: premium guaranteed 30s, other tiers 120s) and
// states which alerts fire at 20m, with their labels and annotations.
const alertTests = `rule_files:
  - RULES
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # Stated guarantees, as the controller exports them: premium 61s
      # (reported by two controllers mid-handover), standard 121s, batch
      # 181s, gold 200s until 10m then 100s; free states none. The other
      # namespace's pool states one too.
      - series: 'tiergate_tier_max_wait_seconds{namespace="tiergate-system",pod="ctl-0",pool="tiergate-system/llm",tier="premium"}'
        values: '61x30'
      - series: 'tiergate_tier_max_wait_seconds{namespace="tiergate-system",pod="ctl-1",pool="tiergate-system/llm",tier="premium"}'
        values: '61x30'
      - series: 'tiergate_tier_max_wait_seconds{namespace="tiergate-system",pod="ctl-0",pool="tiergate-system/llm",tier="standard"}'
        values: '121x30'
      - series: 'tiergate_tier_max_wait_seconds{namespace="tiergate-system",pod="ctl-0",pool="tiergate-system/llm",tier="batch"}'
        values: '181x30'
      - series: 'tiergate_tier_max_wait_seconds{namespace="tiergate-system",pod="ctl-0",pool="tiergate-system/llm",tier="gold"}'
        values: '200x10 100x20'
      - series: 'tiergate_tier_max_wait_seconds{namespace="tiergate-system",pod="ctl-0",pool="elsewhere/llm",tier="premium"}'
        values: '61x30'
      # Oldest queued age, on two dispatchers (max is taken). premium 45s:
      # over the values' 30s but under the stated 61s, quiet. standard 130s
      # on d-1: over its stated 121s. batch 150s: over the values' 120s but
      # under the stated 181s, quiet. gold 150s: under its 200s, over it
      # once it becomes 100s at 10m. free 150s: no stated guarantee, over
      # the values' 120s. Another namespace is out of scope.
      - series: 'tiergate_oldest_queued_age_seconds{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="premium"}'
        values: '45x30'
      - series: 'tiergate_oldest_queued_age_seconds{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="standard"}'
        values: '100x30'
      - series: 'tiergate_oldest_queued_age_seconds{namespace="tiergate-system",pod="d-1",pool="tiergate-system/llm",tier="standard"}'
        values: '130x30'
      - series: 'tiergate_oldest_queued_age_seconds{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="batch"}'
        values: '150x30'
      - series: 'tiergate_oldest_queued_age_seconds{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="gold"}'
        values: '150x30'
      - series: 'tiergate_oldest_queued_age_seconds{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="free"}'
        values: '150x30'
      - series: 'tiergate_oldest_queued_age_seconds{namespace="elsewhere",pod="d-0",pool="elsewhere/llm",tier="premium"}'
        values: '500x30'
      # Refusals: free tenants at their limit 0.2/s (over 0.1); premium
      # 2 x 1/30 per second (under 0.1); free capacity 1/s (over 0.5).
      - series: 'tiergate_rejections_total{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="free",cause="tenant_limit"}'
        values: '0+12x30'
      - series: 'tiergate_rejections_total{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="premium",cause="tenant_limit"}'
        values: '0+2x30'
      - series: 'tiergate_rejections_total{namespace="tiergate-system",pod="d-1",pool="tiergate-system/llm",tier="premium",cause="tenant_limit"}'
        values: '0+2x30'
      - series: 'tiergate_rejections_total{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="free",cause="capacity"}'
        values: '0+60x30'
      - series: 'tiergate_rejections_total{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="premium",cause="capacity"}'
        values: '0+6x30'
      # Utilisation: d-0 half idle with work queued (caps too tight); d-1
      # full with work queued; d-2 idle with nothing queued.
      - series: 'tiergate_utilisation{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm"}'
        values: '0.5x30'
      - series: 'tiergate_queue_length{namespace="tiergate-system",pod="d-0",pool="tiergate-system/llm",tier="premium"}'
        values: '3x30'
      - series: 'tiergate_utilisation{namespace="tiergate-system",pod="d-1",pool="tiergate-system/llm"}'
        values: '1x30'
      - series: 'tiergate_queue_length{namespace="tiergate-system",pod="d-1",pool="tiergate-system/llm",tier="premium"}'
        values: '5x30'
      - series: 'tiergate_utilisation{namespace="tiergate-system",pod="d-2",pool="tiergate-system/llm"}'
        values: '0.2x30'
      - series: 'tiergate_queue_length{namespace="tiergate-system",pod="d-2",pool="tiergate-system/llm",tier="premium"}'
        values: '0x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: TiergateQueuedBeyondGuarantee
        exp_alerts:
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: free}
            exp_annotations:
              summary: "A free request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier free in pool tiergate-system/llm has waited 2m 30s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: gold}
            exp_annotations:
              summary: "A gold request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier gold in pool tiergate-system/llm has waited 2m 30s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: standard}
            exp_annotations:
              summary: "A standard request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier standard in pool tiergate-system/llm has waited 2m 10s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
      # Before gold's guarantee drops, only free and standard.
      - eval_time: 9m
        alertname: TiergateQueuedBeyondGuarantee
        exp_alerts:
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: free}
            exp_annotations:
              summary: "A free request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier free in pool tiergate-system/llm has waited 2m 30s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: standard}
            exp_annotations:
              summary: "A standard request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier standard in pool tiergate-system/llm has waited 2m 10s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
      # gold is over its new guarantee since 11m, not yet for 2m.
      - eval_time: 11m
        alertname: TiergateQueuedBeyondGuarantee
        exp_alerts:
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: free}
            exp_annotations:
              summary: "A free request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier free in pool tiergate-system/llm has waited 2m 30s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: standard}
            exp_annotations:
              summary: "A standard request in pool tiergate-system/llm has queued beyond the tier's stated guarantee."
              description: "The oldest queued request of tier standard in pool tiergate-system/llm has waited 2m 10s, longer than the guarantee the ServiceTier states (status.maxWait). The pool is serving slower than its declared service time, or it lost replicas: compare the ModelPool's observedServiceTime and readyReplicas."
      - eval_time: 1m
        alertname: TiergateQueuedBeyondGuarantee
        exp_alerts: []
      - eval_time: 20m
        alertname: TiergateTenantLimitRefusals
        exp_alerts:
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: free}
            exp_annotations:
              summary: "Tenants of tier free are refused at their own limit."
              description: "200m requests per second of tier free in pool tiergate-system/llm are refused with tenant_limit. A customer sends more than its share allows and needs a conversation (or a TenantQuota maxConcurrency override)."
      - eval_time: 5m
        alertname: TiergateTenantLimitRefusals
        exp_alerts: []
      - eval_time: 20m
        alertname: TiergateCapacityRefusals
        exp_alerts:
          - exp_labels: {severity: warning, namespace: tiergate-system, pool: tiergate-system/llm, tier: free}
            exp_annotations:
              summary: "Pool tiergate-system/llm refuses free requests for lack of capacity."
              description: "1 requests per second of tier free in pool tiergate-system/llm find the tier's queue full. The pool needs more replicas."
      - eval_time: 20m
        alertname: TiergateCapsTooTight
        exp_alerts:
          - exp_labels: {severity: warning, namespace: tiergate-system, pod: d-0, pool: tiergate-system/llm}
            exp_annotations:
              summary: "Pool tiergate-system/llm has idle slots while requests queue."
              description: "Dispatcher d-0 of pool tiergate-system/llm keeps requests queued although utilisation is below 1: every queued tenant is at its concurrency limit. Raise the tiers' tenantShare or the tenants' maxConcurrency."
      - eval_time: 10m
        alertname: TiergateCapsTooTight
        exp_alerts: []
`

func TestAlertsFire(t *testing.T) {
	rules, _ := ruleFile(t, "--set", "metrics.prometheusRule.enabled=true,metrics.prometheusRule.oldestQueuedAge.maxWaitSecondsByTier.premium=30")
	tests := filepath.Join(filepath.Dir(rules), "tests.yaml")
	if err := os.WriteFile(tests, []byte(strings.ReplaceAll(alertTests, "RULES", rules)), 0o644); err != nil {
		t.Fatal(err)
	}
	r := promtool(t).Run("test", "rules", tests)
	if r.Err != nil || !strings.Contains(r.Stdout, "SUCCESS") {
		t.Fatalf("promtool test rules:\n%s", r)
	}
}

// controllerExported are the controller metrics the alerts and the
// dashboard read: family name → label names. The controller run by
// runControllerAsServiceAccount must serve exactly these labels.
var controllerExported = map[string]map[string]bool{
	"tiergate_tier_max_wait_seconds": {"pool": true, "tier": true},
}

// exported gathers what dispatcher/metrics really exports, with every series
// present, plus controllerExported: family name → label names.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, func() metrics.Snapshot {
		return metrics.Snapshot{
			Pool: "ns/llm", Slots: 4, InFlight: 2, PolicyVersion: 1,
			Tiers: map[string]metrics.TierLevel{"premium": {Queued: 1, Bound: 5, OldestAge: time.Second,
				QueuedTokens: 10, TokenBound: 100, Fair: true, FairnessGap: 1, FairnessGapBound: 2}},
			Backends: map[string]int64{"127.0.0.1:8000": 1},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	m.SetTiers("ns/llm", []string{"premium"})
	m.ObserveWait("ns/llm", "premium", time.Second)
	m.ObserveService("ns/llm", "premium", time.Second)
	m.Reject("ns/llm", "premium", "capacity")
	m.Abandon("ns/llm", "premium", metrics.StageQueued)
	m.Request("ns/llm", "premium", 200)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for name, labels := range controllerExported {
		out[name] = labels
	}
	for _, f := range families {
		labels := map[string]bool{}
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
		names := []string{f.GetName()}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{f.GetName() + "_bucket", f.GetName() + "_sum", f.GetName() + "_count"}
		}
		for _, n := range names {
			l := map[string]bool{}
			for k := range labels {
				l[k] = true
			}
			if strings.HasSuffix(n, "_bucket") {
				l["le"] = true
			}
			out[n] = l
		}
	}
	return out
}

// Labels Prometheus adds when it scrapes a pod through the ServiceMonitor.
var targetLabels = map[string]bool{"namespace": true, "pod": true, "job": true, "instance": true, "service": true, "container": true, "endpoint": true}

var (
	metricRef  = regexp.MustCompile(`\btiergate_[a-z_]+`)
	byClause   = regexp.MustCompile(`\b(?:by|on)\s*\(([^)]*)\)`)
	matcherRef = regexp.MustCompile(`([a-z_]+)\s*(?:=~|!~|!=|=)\s*"`)
)

// checkExpr fails when expr uses a metric or a label the dispatcher does not
// export (or the scrape does not add).
func checkExpr(t *testing.T, where, expr string, known map[string]map[string]bool) {
	t.Helper()
	refs := metricRef.FindAllString(expr, -1)
	if len(refs) == 0 {
		t.Errorf("%s uses no tiergate metric: %s", where, expr)
	}
	allowed := map[string]bool{}
	for k := range targetLabels {
		allowed[k] = true
	}
	for _, ref := range refs {
		labels, ok := known[ref]
		if !ok {
			t.Errorf("%s uses %s, which neither dispatcher/metrics nor the controller exports: %s", where, ref, expr)
			continue
		}
		for l := range labels {
			allowed[l] = true
		}
	}
	var used []string
	for _, m := range byClause.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			used = append(used, strings.TrimSpace(l))
		}
	}
	for _, m := range matcherRef.FindAllStringSubmatch(expr, -1) {
		used = append(used, m[1])
	}
	for _, l := range used {
		if l != "" && !allowed[l] {
			t.Errorf("%s uses label %q, which none of its metrics carries: %s", where, l, expr)
		}
	}
}

func TestRulesUseExportedMetrics(t *testing.T) {
	known := exported(t)
	_, groups := ruleFile(t, "-f", filepath.Join("test", "helm", "testdata", "all-options.yaml"))
	var alerts []string
	for _, g := range groups {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rule := r.(map[string]any)
			alerts = append(alerts, rule["alert"].(string))
			checkExpr(t, "alert "+rule["alert"].(string), rule["expr"].(string), known)
		}
	}
	want := []string{"TiergateQueuedBeyondGuarantee", "TiergateTenantLimitRefusals", "TiergateCapacityRefusals", "TiergateCapsTooTight"}
	if diff := cmp.Diff(want, alerts); diff != "" {
		t.Errorf("alerts (-want +got):\n%s", diff)
	}
}

// dashboard is the part of the Grafana JSON the tests read.
type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "tiergate.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}

	t.Run("shipped in the ConfigMap unchanged", func(t *testing.T) {
		cm := find(t, render(t, "--set", "metrics.dashboard.enabled=true"), "ConfigMap", "tiergate-dashboard")
		got := field[string](t, cm, "data", "tiergate.json")
		if diff := cmp.Diff(strings.TrimSuffix(string(raw), "\n"), got); diff != "" {
			t.Errorf("ConfigMap data (-file +configmap):\n%s", diff)
		}
		if l := cm.GetLabels()["grafana_dashboard"]; l != "1" {
			t.Errorf("grafana_dashboard label = %q, want \"1\"", l)
		}
	})

	t.Run("queries use exported metrics and labels", func(t *testing.T) {
		known := exported(t)
		ids := map[int]bool{}
		for _, p := range d.Panels {
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				checkExpr(t, "panel "+p.Title, tg.Expr, known)
			}
		}
	})

	t.Run("the panels the issue asks for", func(t *testing.T) {
		var exprs []string
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
		}
		required := map[string]*regexp.Regexp{
			"queue wait p50 per tier":        regexp.MustCompile(`histogram_quantile\(0\.5, sum by \(tier, le\) \(rate\(tiergate_queue_wait_seconds_bucket`),
			"queue wait p95 per tier":        regexp.MustCompile(`histogram_quantile\(0\.95, sum by \(tier, le\) \(rate\(tiergate_queue_wait_seconds_bucket`),
			"oldest queued age":              regexp.MustCompile(`max by \(tier\) \(tiergate_oldest_queued_age_seconds`),
			"refusals by cause":              regexp.MustCompile(`sum by \(cause\) \(rate\(tiergate_rejections_total`),
			"utilisation":                    regexp.MustCompile(`tiergate_utilisation`),
			"fairness gap against its bound": regexp.MustCompile(`max by \(tier\) \(tiergate_fairness_gap(_bound)?_tokens`),
			"pool and namespace scope":       regexp.MustCompile(`namespace=~"\$namespace",pool=~"\$pool"`),
		}
		for what, re := range required {
			if !slices.ContainsFunc(exprs, re.MatchString) {
				t.Errorf("no query shows %s (want one matching %s)", what, re)
			}
		}
		var vars []string
		for _, v := range d.Templating.List {
			vars = append(vars, v.Name)
		}
		if diff := cmp.Diff([]string{"datasource", "namespace", "pool"}, vars); diff != "" {
			t.Errorf("template variables (-want +got):\n%s", diff)
		}
	})
}
