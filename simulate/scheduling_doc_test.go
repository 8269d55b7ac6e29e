package simulate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/template"
)

// docScenario is one scenario of docs/scheduling.md: the files it runs
// (relative to the repository) and its results once run.
type docScenario struct {
	name  string
	files []string
	// compare is what the scenario runs next to tiergate.
	compare []string
	res     *Result
}

func docScenarios() []*docScenario {
	seed := func(pool, load string) []string {
		return []string{"examples/simulate/seed/" + pool, "examples/simulate/seed/tiers.yaml", "examples/simulate/seed/quotas.yaml", "examples/simulate/compare/" + load}
	}
	return append([]*docScenario{
		{name: "seed-2x", files: seed("pool.yaml", "seed-2x.yaml"), compare: Baselines},
		{name: "premium-overload", files: seed("pool-4m.yaml", "premium-overload.yaml"), compare: Baselines},
		{name: "noisy-tenant", files: seed("pool-4m.yaml", "noisy-tenant.yaml"), compare: Baselines},
		{name: "scale-down", files: seed("pool-4m.yaml", "scale-down.yaml"), compare: Baselines},
	}, tokenDocScenarios()...)
}

// TestSchedulingDoc regenerates docs/scheduling.md and its figures from
// testdata/scheduling.md.tmpl and fresh runs of the scenarios in
// examples/simulate/compare, and fails if the committed files differ.
// `make scheduling-doc` (this test with -update) rewrites them.
func TestSchedulingDoc(t *testing.T) {
	scs := docScenarios()
	// The runs are independent and single-threaded: run them side by side.
	var wg sync.WaitGroup
	errs := make([]error, len(scs))
	for i, sc := range scs {
		var paths []string
		for _, f := range sc.files {
			paths = append(paths, filepath.Join("..", f))
		}
		in := read(t, paths...)
		wg.Go(func() { sc.res, errs[i] = Run(in, Options{Compare: sc.compare}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	files := map[string][]byte{}
	md, err := renderSchedulingDoc(scs)
	if err != nil {
		t.Fatal(err)
	}
	files[filepath.Join("..", "docs", "scheduling.md")] = md
	for _, sc := range scs {
		var png bytes.Buffer
		if err := WriteComparePlot(&png, sc.res); err != nil {
			t.Fatal(err)
		}
		files[filepath.Join("..", "docs", "scheduling", sc.name+".png")] = png.Bytes()
	}
	for path, want := range files {
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run make scheduling-doc)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what the scenarios give now: run make scheduling-doc", path)
		}
	}
}

func renderSchedulingDoc(scs []*docScenario) ([]byte, error) {
	by := map[string]*docScenario{}
	for _, sc := range scs {
		by[sc.name] = sc
	}
	get := func(name string) (*docScenario, error) {
		if sc := by[name]; sc != nil {
			return sc, nil
		}
		return nil, fmt.Errorf("no scenario %q", name)
	}
	funcs := template.FuncMap{
		"command": func(name string) (string, error) {
			sc, err := get(name)
			if err != nil {
				return "", err
			}
			return "tiergate simulate -f " + strings.Join(sc.files, " -f ") + " --compare " + strings.Join(sc.compare, ","), nil
		},
		"tables": func(name string) (string, error) {
			sc, err := get(name)
			if err != nil {
				return "", err
			}
			return markdownTables(sc.res), nil
		},
		"figure": func(name string) string {
			return fmt.Sprintf("![%s: goodput and waste per scheduler, queue waits per tier](scheduling/%s.png)", name, name)
		},
		"pool": func(name, sched, field string) (string, error) {
			sc, err := get(name)
			if err != nil {
				return "", err
			}
			return poolFigure(sc.res.Of(sched), field)
		},
		"tier": func(name, sched, tier, field string) (string, error) {
			sc, err := get(name)
			if err != nil {
				return "", err
			}
			return tierFigure(sc.res.Of(sched), tier, field)
		},
		"others": func(name, tier, except string) (string, error) {
			sc, err := get(name)
			if err != nil {
				return "", err
			}
			return othersTable(sc.res, tier, except), nil
		},
	}
	addTokenDocFuncs(funcs, get)
	tmpl, err := template.New("scheduling.md.tmpl").Funcs(funcs).ParseFiles(filepath.Join("testdata", "scheduling.md.tmpl"))
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, nil); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func poolFigure(r *Result, field string) (string, error) {
	switch field {
	case "goodput":
		return fmt.Sprintf("%.2f", r.Goodput), nil
	case "waste":
		return fmt.Sprintf("%.0f", r.WastedServiceSeconds), nil
	case "wasteShare":
		return fmt.Sprintf("%.0f%%", 100*r.WastedServiceSeconds/r.busySlotSeconds), nil
	case "utilisation":
		return fmt.Sprintf("%.0f%%", 100*r.Utilisation), nil
	}
	return "", fmt.Errorf("no pool figure %q", field)
}

func tierFigure(r *Result, tier, field string) (string, error) {
	t := r.Tiers[tier]
	if t == nil {
		return "", fmt.Errorf("no tier %q", tier)
	}
	switch field {
	case "served":
		return fmt.Sprint(t.Served), nil
	case "offered":
		return fmt.Sprint(t.Offered), nil
	case "throughput":
		return fmt.Sprintf("%.2f", t.Throughput), nil
	case "slo":
		return fmt.Sprintf("%.0f%%", 100*t.SLOAttainment), nil
	case "jain":
		return fmt.Sprintf("%.2f", t.Jain), nil
	case "p50":
		return fmt.Sprintf("%.1f s", t.Wait.P50), nil
	case "p95":
		return fmt.Sprintf("%.1f s", t.Wait.P95), nil
	case "max":
		return fmt.Sprintf("%.1f s", t.Wait.Max), nil
	case "refused":
		return fmt.Sprint(t.Refused.Total()), nil
	case "maxWait":
		return fmt.Sprintf("%.0f s", t.MaxWait), nil
	case "expired":
		return fmt.Sprint(t.Expired), nil
	case "jainTokens":
		return fmt.Sprintf("%.3f", t.JainTokens), nil
	case "worst":
		return fmt.Sprintf("%.0f s", t.Wait.Max), nil
	case "underLimitsWorst":
		return fmt.Sprintf("%.0f s", t.UnderLimits.MaxWait), nil
	case "tokenBound":
		return fmt.Sprint(t.QueueTokenBound), nil
	case "tenantTokenLimit":
		return fmt.Sprint(t.TenantQueueTokenLimit), nil
	case "tokensPerMin":
		return fmt.Sprintf("%.0f", r.perMinute(t.TokensServed.Total())), nil
	}
	return "", fmt.Errorf("no tier figure %q", field)
}

// markdownTables is a scenario's comparison: the pool, then each tier.
func markdownTables(r *Result) string {
	var b strings.Builder
	b.WriteString("| pool | goodput (req/s) | wasted (slot-s) | of busy slot time | utilisation |\n|---|---:|---:|---:|---:|\n")
	for _, n := range r.Schedulers() {
		o := r.Of(n)
		fmt.Fprintf(&b, "| %s | %.3f | %.0f | %.1f%% | %.1f%% |\n", n, o.Goodput, o.WastedServiceSeconds, 100*o.WastedServiceSeconds/o.busySlotSeconds, 100*o.Utilisation)
	}
	for _, tier := range r.tierOrder() {
		t := r.Tiers[tier]
		fmt.Fprintf(&b, "\n| %s (W %s) | offered | served | thru/s | expired | abandoned | refused | SLO | Jain | wait p50 | p95 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
			tier, t.tolerableWait)
		for _, n := range r.Schedulers() {
			f := r.Of(n).Tiers[tier]
			fmt.Fprintf(&b, "| %s | %d | %d | %.3f | %d | %d | %d | %.1f%% | %.3f | %s | %s | %s | %s |\n",
				n, f.Offered, f.Served, f.Throughput, f.Expired, f.Abandoned, f.Refused.Total(),
				100*f.SLOAttainment, f.Jain, waitCell(f, f.Wait.P50), waitCell(f, f.Wait.P95), waitCell(f, f.Wait.P99), waitCell(f, f.Wait.Max))
		}
	}
	return b.String()
}

func waitCell(f *TierResult, v float64) string {
	if f.Wait.Count == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1fs", v)
}

// othersTable sums the tenants of tier other than except, per scheduler.
func othersTable(r *Result, tier, except string) string {
	var b strings.Builder
	b.WriteString("| scheduler | offered | served | abandoned | refused | mean wait | worst tenant's p95 wait |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range r.Schedulers() {
		var offered, served, abandoned, refused, waits int64
		var sum, p95 float64
		for name, tn := range r.Of(n).Tenants {
			if tn.Tier != tier || name == except {
				continue
			}
			offered += tn.Offered
			served += tn.Served
			abandoned += tn.Abandoned
			refused += tn.Refused.Total()
			sum += tn.Wait.Mean * float64(tn.Wait.Count)
			waits += tn.Wait.Count
			p95 = max(p95, tn.Wait.P95)
		}
		mean, worst := "–", "–"
		if waits > 0 {
			mean, worst = fmt.Sprintf("%.1fs", sum/float64(waits)), fmt.Sprintf("%.1fs", p95)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %s |\n", n, offered, served, abandoned, refused, mean, worst)
	}
	return b.String()
}
