package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const smallExample = "examples/simulate/small.yaml"

func TestSimulateCommandErrors(t *testing.T) {
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStderr string // a line of stderr
	}{
		"no files": {
			args:       nil,
			wantCode:   2,
			wantStderr: "tiergate simulate: no input: pass the pool, tiers, quotas and Load with -f",
		},
		"positional file": {
			args:       []string{smallExample},
			wantCode:   2,
			wantStderr: `tiergate simulate: unexpected arguments ["examples/simulate/small.yaml"] (files go after -f)`,
		},
		"bad seed": {
			args:       []string{"-f", smallExample, "--seed", "-1"},
			wantCode:   2,
			wantStderr: `invalid value "-1" for flag -seed: must be a non-negative integer`,
		},
		"missing file": {
			args:       []string{"-f", "examples/simulate/nope.yaml"},
			wantCode:   1,
			wantStderr: "tiergate simulate: open examples/simulate/nope.yaml: no such file or directory",
		},
		"unknown scheduler": {
			args:       []string{"-f", smallExample, "--compare", "fcfs,lifo"},
			wantCode:   2,
			wantStderr: `invalid value "fcfs,lifo" for flag -compare: scheduler "lifo" is unknown (want fcfs, strict, seed, vtc or vtc-tokenbound)`,
		},
		"no scheduler": {
			args:       []string{"-f", smallExample, "--compare", ""},
			wantCode:   2,
			wantStderr: `invalid value "" for flag -compare: no scheduler named (want fcfs, strict, seed, vtc or vtc-tokenbound)`,
		},
		"scheduler twice": {
			args:       []string{"-f", smallExample, "--compare", "seed,seed"},
			wantCode:   2,
			wantStderr: `invalid value "seed,seed" for flag -compare: scheduler "seed" is named twice`,
		},
		"compare plot without compare": {
			args:       []string{"-f", smallExample, "--compare-plot", "x.png"},
			wantCode:   2,
			wantStderr: "tiergate simulate: --compare-plot needs --compare",
		},
		"missing Load": {
			args:       []string{"-f", "examples/simulate/seed/pool.yaml", "-f", "examples/simulate/seed/tiers.yaml"},
			wantCode:   1,
			wantStderr: "tiergate simulate: no Load document: pass one with -f (kind: Load)",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := dispatch(append([]string{"simulate"}, tc.args...), &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr+"\n") {
				t.Errorf("stderr does not contain %q:\n%s", tc.wantStderr, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout not empty on error:\n%s", stdout.String())
			}
		})
	}
}

func TestSimulateCommandJSONAndPlot(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "wait.png")
	var stdout, stderr bytes.Buffer
	code := dispatch([]string{"simulate", "-f", smallExample, "--json", "--plot", plot, "--seed", "42"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	var doc struct {
		Seed             uint64   `json:"seed"`
		Utilisation      *float64 `json:"utilisation"`
		SimulatedSeconds float64  `json:"simulatedSeconds"`
		Tiers            map[string]map[string]json.RawMessage
		Tenants          map[string]map[string]json.RawMessage
		Warnings         []string `json:"warnings"`
	}
	dec := json.NewDecoder(&stdout)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("stdout is not one JSON object: %v", err)
	}
	if dec.More() {
		t.Error("more than one JSON value on stdout")
	}
	if doc.Seed != 42 || doc.Utilisation == nil || doc.SimulatedSeconds != 600 || doc.Warnings == nil {
		t.Errorf("top level: seed %d, utilisation %v, simulatedSeconds %g, warnings %v", doc.Seed, doc.Utilisation, doc.SimulatedSeconds, doc.Warnings)
	}
	// The field names that outside scripts rely on.
	want := []string{"abandoned", "admitted", "bound", "maxWait", "offered", "refused", "served", "tenantLimit", "throughput", "wait"}
	for name, tier := range doc.Tiers {
		for _, f := range want {
			if _, ok := tier[f]; !ok {
				t.Errorf("tier %s has no %q", name, f)
			}
		}
		var refused map[string]int64
		var wait map[string]float64
		_ = json.Unmarshal(tier["refused"], &refused)
		_ = json.Unmarshal(tier["wait"], &wait)
		for _, k := range []string{"capacity", "tenant_limit"} {
			if _, ok := refused[k]; !ok {
				t.Errorf("tier %s refused has no %q", name, k)
			}
		}
		for _, k := range []string{"mean", "p50", "p95", "p99", "max"} {
			if _, ok := wait[k]; !ok {
				t.Errorf("tier %s wait has no %q", name, k)
			}
		}
	}
	if got := len(doc.Tenants); got != 4 {
		t.Errorf("%d tenants, want 4", got)
	}
	for name, tn := range doc.Tenants {
		for _, f := range []string{"offered", "admitted", "served", "abandoned", "refused", "wait", "throughput", "tenantLimit"} {
			if _, ok := tn[f]; !ok {
				t.Errorf("tenant %s has no %q", name, f)
			}
		}
	}

	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("--plot did not write a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 300 {
		t.Errorf("plot is %dx%d, want a readable size", b.Dx(), b.Dy())
	}
}

func TestSimulateCommandText(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := dispatch([]string{"simulate", "-f", "examples/simulate/seed/pool.yaml", "-f", "examples/simulate/seed/tiers.yaml",
		"-f", "examples/simulate/seed/quotas.yaml", "-f", "examples/simulate/seed/load-overload.yaml"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	lines := strings.Split(out, "\n")
	if diff := cmp.Diff("Pool default/llm: 6 replicas, 24 slots, service time 6s, μ 4 req/s, ageing 6s per point (horizon 2m0s), clientTimeout 30s", lines[0]); diff != "" {
		t.Errorf("first line (-want +got):\n%s", diff)
	}
	for _, s := range []string{"\n      TIER  OFFERED", "\nStated (per tier, pool-wide) next to observed:\n", "\nTenants:\n",
		"\nWARNING: AgeingHorizonExceedsClientTimeout: ageing horizon 2m0s (6s per point × 20 points) exceeds clientTimeout 30s"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

// TestSimulateCommandCompare runs examples with --compare (the scenarios of
// docs/scheduling.md run in simulate's TestSchedulingDoc): the JSON carries
// the same shape for tiergate and each baseline, the tables one comparison
// per tier, and --compare-plot writes a PNG.
func TestSimulateCommandCompare(t *testing.T) {
	seed := func(pool, load string) []string {
		return []string{"-f", "examples/simulate/seed/" + pool, "-f", "examples/simulate/seed/tiers.yaml", "-f", "examples/simulate/seed/quotas.yaml", "-f", load}
	}
	examples := map[string][]string{
		"small":            {"-f", smallExample},
		"premium overload": seed("pool-4m.yaml", "examples/simulate/compare/premium-overload.yaml"),
	}
	for name, files := range examples {
		t.Run(name, func(t *testing.T) {
			plot := filepath.Join(t.TempDir(), "compare.png")
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"simulate"}, files...), "--compare", "fcfs,strict,seed", "--json", "--compare-plot", plot)
			if code := dispatch(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
			}
			type result struct {
				Goodput              *float64                              `json:"goodput"`
				WastedServiceSeconds *float64                              `json:"wastedServiceSeconds"`
				Tiers                map[string]map[string]json.RawMessage `json:"tiers"`
				Tenants              map[string]json.RawMessage            `json:"tenants"`
			}
			var doc struct {
				result
				Compare map[string]result `json:"compare"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
				t.Fatal(err)
			}
			if len(doc.Compare) != 3 {
				t.Fatalf("compare has %d entries, want fcfs, strict and seed", len(doc.Compare))
			}
			all := map[string]result{"tiergate": doc.result}
			for k, v := range doc.Compare {
				all[k] = v
			}
			for sched, r := range all {
				if r.Goodput == nil || r.WastedServiceSeconds == nil {
					t.Errorf("%s: no goodput or wastedServiceSeconds", sched)
				}
				if len(r.Tiers) != len(doc.Tiers) || len(r.Tenants) != len(doc.Tenants) {
					t.Errorf("%s: %d tiers and %d tenants, tiergate %d and %d", sched, len(r.Tiers), len(r.Tenants), len(doc.Tiers), len(doc.Tenants))
				}
				for tier, f := range r.Tiers {
					for _, k := range []string{"sloAttainment", "jain", "served", "wait", "queue"} {
						if _, ok := f[k]; !ok {
							t.Errorf("%s: tier %s has no %q", sched, tier, k)
						}
					}
				}
			}
			expectPNG(t, plot)

			stdout.Reset()
			args = append(append([]string{"simulate"}, files...), "--compare", "fcfs,strict,seed")
			if code := dispatch(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
			}
			out := stdout.String()
			for _, want := range []string{"\nGoodput ", "\nCompared on the same arrivals and service times:\n", "POOL  GOODPUT/S  WASTED SLOT-S  OF BUSY  UTILISATION\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("the tables lack %q:\n%s", want, out)
				}
			}
			for tier := range doc.Tiers {
				head := "\nTier " + tier + " (basePriority "
				i := strings.Index(out, head)
				if i < 0 {
					t.Errorf("no comparison table for tier %s", tier)
					continue
				}
				lines := strings.Split(out[i+1:], "\n")
				for j, sched := range []string{"tiergate", "fcfs", "strict", "seed"} {
					if f := strings.Fields(lines[2+j]); len(f) == 0 || f[0] != sched {
						t.Errorf("tier %s: row %d is %q, want %s", tier, j, lines[2+j], sched)
					}
				}
			}
		})
	}
}

// TestSimulateCommandTokens runs the long-prompts example of
// docs/scheduling.md with the token variants: the JSON carries each
// scheduler's tokensServed, tokenShare and jainTokens, and the token
// bound vtc-tokenbound computed; the tables name what each scheduler is.
// vtc-tokenbound refuses a pool without token rates.
func TestSimulateCommandTokens(t *testing.T) {
	files := []string{"simulate", "-f", "examples/simulate/tokens/long-prompts-pool.yaml", "-f", "examples/simulate/tokens/long-prompts.yaml", "--compare", "vtc,vtc-tokenbound"}
	var stdout, stderr bytes.Buffer
	if code := dispatch(append(files, "--json"), &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	type tenant struct {
		TokensServed struct{ Prompt, Completion int64 } `json:"tokensServed"`
		TokenShare   float64                            `json:"tokenShare"`
	}
	type tier struct {
		JainTokens      float64 `json:"jainTokens"`
		QueueTokenBound int64   `json:"queueTokenBound"`
	}
	type result struct {
		Tiers             map[string]tier   `json:"tiers"`
		Tenants           map[string]tenant `json:"tenants"`
		MeasuredTokenRate float64           `json:"measuredTokenRate"`
		Policy            struct {
			TokenRate float64 `json:"tokenRate"`
		} `json:"policy"`
	}
	var doc struct {
		result
		Compare map[string]result `json:"compare"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	all := map[string]result{"tiergate": doc.result, "vtc": doc.Compare["vtc"], "vtc-tokenbound": doc.Compare["vtc-tokenbound"]}
	for sched, r := range all {
		for name, tn := range r.Tenants {
			// Every served request has 200 output tokens and 100 or 4000
			// prompt tokens.
			per := map[string]int64{"chat": 100, "rag": 4000}[name]
			if n := tn.TokensServed.Completion / 200; n == 0 || tn.TokensServed.Prompt != n*per || tn.TokenShare <= 0 {
				t.Errorf("%s: tenant %s: tokensServed %+v, tokenShare %v", sched, name, tn.TokensServed, tn.TokenShare)
			}
		}
		if j := r.Tiers["standard"].JainTokens; j <= 0 || j > 1 {
			t.Errorf("%s: jainTokens %v", sched, j)
		}
		// Every answer is a chat one (500 per 5.05 s) or a rag one (4400
		// per 7 s), so what the queue measures is between the two.
		if m := r.MeasuredTokenRate; m < 500/5.05 || m > 4400/7.0 {
			t.Errorf("%s: measuredTokenRate %v, want between %v and %v", sched, m, 500/5.05, 4400/7.0)
		}
	}
	// r = 3 × 2000 × 40 ÷ 2040, for the token bounds only.
	if got := [3]float64{doc.Policy.TokenRate, doc.Compare["vtc"].Policy.TokenRate, doc.Compare["vtc-tokenbound"].Policy.TokenRate}; got != [3]float64{0, 0, 117.647059} {
		t.Errorf("policy.tokenRate of tiergate, vtc, vtc-tokenbound = %v, want [0 0 117.647059]", got)
	}
	if got := [3]int64{doc.Tiers["standard"].QueueTokenBound, doc.Compare["vtc"].Tiers["standard"].QueueTokenBound, doc.Compare["vtc-tokenbound"].Tiers["standard"].QueueTokenBound}; got != [3]int64{0, 0, 56470} {
		t.Errorf("queueTokenBound of tiergate, vtc, vtc-tokenbound = %v, want [0 0 56470]", got)
	}

	stdout.Reset()
	if code := dispatch(files, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	want := "Compared on the same arrivals and service times:\n" +
		"  tiergate        tiergate's queue as configured\n" +
		"  vtc             tiergate, the pool with fairness.mode Tokens, tokens.boundBy Requests\n" +
		"  vtc-tokenbound  tiergate, the pool with fairness.mode Tokens, tokens.boundBy Tokens\n"
	if !strings.Contains(stdout.String(), want) {
		t.Errorf("the tables lack\n%s\n%s", want, stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := dispatch([]string{"simulate", "-f", smallExample, "--compare", "vtc-tokenbound"}, &stdout, &stderr); code != 1 {
		t.Errorf("exit code %d for vtc-tokenbound without token rates, want 1", code)
	}
	wantErr := "tiergate simulate: --compare vtc-tokenbound: invalid: the pool declares no spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond, from which the token bounds are computed\n"
	if diff := cmp.Diff(wantErr, stderr.String()); diff != "" {
		t.Errorf("stderr (-want +got):\n%s", diff)
	}
}

func expectPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 500 {
		t.Errorf("%s is %dx%d, want a readable size", path, b.Dx(), b.Dy())
	}
}

// TestSimulateCommandBudgets runs the budgets example: the JSON carries
// tokensServed per tier and tenant, the rate_limited refusals and the
// budgets in force; the tables add their columns.
func TestSimulateCommandBudgets(t *testing.T) {
	const example = "examples/simulate/budgets.yaml"
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"simulate", "-f", example, "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	type figures struct {
		Refused      map[string]int64 `json:"refused"`
		TokensServed map[string]int64 `json:"tokensServed"`
		Budget       map[string]int64 `json:"budget"`
	}
	var doc struct {
		MeasuredSeconds float64            `json:"measuredSeconds"`
		Tiers           map[string]figures `json:"tiers"`
		Tenants         map[string]figures `json:"tenants"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for name, f := range doc.Tiers {
		if _, ok := f.Refused["rate_limited"]; !ok {
			t.Errorf("tier %s: refused has no rate_limited", name)
		}
		if f.TokensServed["prompt"] == 0 || f.TokensServed["completion"] == 0 {
			t.Errorf("tier %s: tokensServed %v", name, f.TokensServed)
		}
	}
	bulk := doc.Tenants["bulk"]
	if diff := cmp.Diff(map[string]int64{"requestsPerMinute": 600, "tokensPerMinute": 30000}, bulk.Budget); diff != "" {
		t.Errorf("bulk's budget (-want +got):\n%s", diff)
	}
	// bulk reserves about four times its budget: most attempts are
	// refused, and what it is served stays near its 30,000 a minute (the
	// window's edges let a little more through).
	perMinute := float64(bulk.TokensServed["prompt"]+bulk.TokensServed["completion"]) * 60 / doc.MeasuredSeconds
	if bulk.Refused["rate_limited"] == 0 || perMinute < 27000 || perMinute > 31000 {
		t.Errorf("bulk: %d rate_limited, %.0f tokens a minute served; want refusals and about its budget of 30000", bulk.Refused["rate_limited"], perMinute)
	}
	if chat := doc.Tenants["chat"]; chat.Refused["rate_limited"] != 0 {
		t.Errorf("chat, under its budget, was rate_limited %d times", chat.Refused["rate_limited"])
	}

	stdout.Reset()
	if code := dispatch([]string{"simulate", "-f", example}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"  TOK prompt  TOK compl  TOK/MIN  ", "  REF 503  REF rate  ", "  BUDGET RPM  BUDGET TPM  "} {
		if !strings.Contains(out, want) {
			t.Errorf("the tables lack %q:\n%s", want, out)
		}
	}
	stdout.Reset()
	if code := dispatch([]string{"simulate", "-f", smallExample}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	if out := stdout.String(); strings.Contains(out, "REF rate") || strings.Contains(out, "TOK/MIN") {
		t.Errorf("a run without tokens or budgets shows their columns:\n%s", out)
	}
}
