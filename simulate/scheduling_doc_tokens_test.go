package simulate

import (
	"fmt"
	"strings"
	"text/template"
)

// tokenDocScenarios are docs/scheduling.md's scenarios of token fairness
// and token bounds (examples/simulate/tokens), run next to vtc and
// vtc-tokenbound.
func tokenDocScenarios() []*docScenario {
	files := func(name string) []string {
		return []string{"examples/simulate/tokens/" + name + "-pool.yaml", "examples/simulate/tokens/" + name + ".yaml"}
	}
	return []*docScenario{
		{name: "long-prompts", files: files("long-prompts"), compare: Variants},
		{name: "heavy-tail", files: files("heavy-tail"), compare: Variants},
	}
}

// addTokenDocFuncs adds the token scenarios' tables and figures to the
// template's functions.
func addTokenDocFuncs(funcs template.FuncMap, get func(string) (*docScenario, error)) {
	funcs["tokenTenants"] = func(name, tier string) (string, error) {
		sc, err := get(name)
		if err != nil {
			return "", err
		}
		return tokenTenantsTable(sc.res, tier), nil
	}
	funcs["worstWaits"] = func(name string) (string, error) {
		sc, err := get(name)
		if err != nil {
			return "", err
		}
		return worstWaitsTable(sc.res), nil
	}
	funcs["tenant"] = func(name, sched, tenant, field string) (string, error) {
		sc, err := get(name)
		if err != nil {
			return "", err
		}
		return tenantFigure(sc.res.Of(sched), tenant, field)
	}
}

// modeOf names a scheduler's fairness and bounds for the tables.
func modeOf(sched string) string {
	switch sched {
	case SchedTiergate:
		return "Requests, request bounds"
	case SchedVTC:
		return "Tokens, request bounds"
	case SchedVTCTokenBound:
		return "Tokens, token bounds"
	}
	return sched
}

// tokenTenantsTable is, per scheduler, the tier's jainTokens and each of
// its tenants' throughput, share of the weighted tokens served, and waits.
func tokenTenantsTable(r *Result, tier string) string {
	var b strings.Builder
	b.WriteString("| scheduler | fairness, bounds | jainTokens | tenant | served (req/s) | share of weighted tokens | refused | wait p50 | p99 | max |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range r.Schedulers() {
		o := r.Of(n)
		for _, tn := range o.tenantOrder() {
			t := o.Tenants[tn]
			if t.Tier != tier {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %.3f | %s | %.3f | %.1f%% | %d | %.1f s | %.1f s | %.1f s |\n",
				n, modeOf(n), o.Tiers[tier].JainTokens, tn, t.Throughput, 100*t.TokenShare, t.Refused.Total(), t.Wait.P50, t.Wait.P99, t.Wait.Max)
		}
	}
	return b.String()
}

// worstWaitsTable is, per tier and scheduler, the worst wait against the
// tier's stated maxWait, with what was served and refused. The verdict is
// on the requests the guarantee is about: those whose tenant stayed under
// its own limits from admission to dispatch.
func worstWaitsTable(r *Result) string {
	var b strings.Builder
	b.WriteString("| tier (stated maxWait) | scheduler | fairness, bounds | served | refused | wait p50 | p99 | worst | worst under its tenant's limits | that within maxWait | jainTokens |\n|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, tier := range r.tierOrder() {
		for _, n := range r.Schedulers() {
			t := r.Of(n).Tiers[tier]
			within := "yes"
			if !t.UnderLimits.WithinMaxWait {
				within = "**no**"
			}
			fmt.Fprintf(&b, "| %s (%.0f s) | %s | %s | %d | %d | %.1f s | %.1f s | %.1f s | %.1f s | %s | %.3f |\n",
				tier, t.MaxWait, n, modeOf(n), t.Served, t.Refused.Total(), t.Wait.P50, t.Wait.P99, t.Wait.Max, t.UnderLimits.MaxWait, within, t.JainTokens)
		}
	}
	return b.String()
}

func tenantFigure(r *Result, tenant, field string) (string, error) {
	t := r.Tenants[tenant]
	if t == nil {
		return "", fmt.Errorf("no tenant %q", tenant)
	}
	switch field {
	case "tokenShare":
		return fmt.Sprintf("%.0f%%", 100*t.TokenShare), nil
	case "throughput":
		return fmt.Sprintf("%.2f", t.Throughput), nil
	case "p50":
		return fmt.Sprintf("%.0f s", t.Wait.P50), nil
	case "p99":
		return fmt.Sprintf("%.0f s", t.Wait.P99), nil
	case "max":
		return fmt.Sprintf("%.0f s", t.Wait.Max), nil
	}
	return "", fmt.Errorf("no tenant figure %q", field)
}
