package main

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"gonum.org/v1/plot/plotter"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestFairScheduleFollowsTheDuration(t *testing.T) {
	tests := map[string]struct {
		main time.Duration
		want time.Duration
	}{
		"30s": {30 * time.Second, 12 * time.Second}, // the floor
		"60s": {time.Minute, 24 * time.Second},
		"3m":  {3 * time.Minute, 40 * time.Second}, // the ceiling
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := newFairSchedule(tc.main); got.Mode != tc.want {
				t.Errorf("mode %s, want %s", got.Mode, tc.want)
			}
		})
	}
}

// The tenants' sizes are what the phase's figures rest on: prompts 40×
// apart, service times proportional to the weighted tokens.
func TestFairTenants(t *testing.T) {
	w := policy.Fairness{InputWeight: 1, OutputWeight: 2}
	type row struct {
		Name    string
		Prompt  int64
		Cost    int64
		Service time.Duration
	}
	var got []row
	for _, ft := range fairTenants() {
		got = append(got, row{ft.Name, ft.promptTokens(), w.Cost(ft.promptTokens(), fairMaxTokens), ft.serviceTime()})
		if n := len(ft.prompt()); n != ft.PromptBytes {
			t.Errorf("%s: prompt of %d bytes, want %d", ft.Name, n, ft.PromptBytes)
		}
	}
	want := []row{{"lexcorp", 2000, 2200, 4400 * time.Millisecond}, {"stark", 50, 250, 500 * time.Millisecond}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestJain(t *testing.T) {
	tests := map[string]struct {
		xs   []float64
		want float64
	}{
		"equal":          {[]float64{5, 5}, 1},
		"one has all":    {[]float64{7, 0}, 0.5},
		"nine to one":    {[]float64{9, 1}, 100.0 / 164},
		"nothing served": {[]float64{0, 0}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := jain(tc.xs); !cmp.Equal(tc.want, got, cmpopts.EquateApprox(0, 1e-12)) {
				t.Errorf("jain(%v) = %v, want %v", tc.xs, got, tc.want)
			}
		})
	}
}

// fairFixture is a phase switched at 10s (patched at 9s), load stopped at
// 20s.
func fairFixture() (*fairRun, []fairCall, []simSample, []sample) {
	f := &fairRun{sched: fairSchedule{Mode: 9 * time.Second}, tenants: fairTenants(),
		weights:      policy.Fairness{Mode: policy.FairnessRequests, InputWeight: 1, OutputWeight: 2},
		shareCommand: "kubectl patch servicetier", switchCommand: "kubectl patch modelpool",
		patchedAt: sec(9), switchedAt: sec(10), switched: 2, loadEnd: sec(20), ended: sec(25)}
	long := func(start, wait float64) fairCall {
		return fairCall{Tenant: "lexcorp", Start: sec(start), Wait: sec(wait), End: sec(start + wait + 4.4), Status: 200, Outcome: outcomeServed, PromptTokens: 2000, CompletionTokens: 100}
	}
	short := func(start, wait float64) fairCall {
		return fairCall{Tenant: "stark", Start: sec(start), Wait: sec(wait), End: sec(start + wait + 0.5), Status: 200, Outcome: outcomeServed, PromptTokens: 50, CompletionTokens: 100}
	}
	calls := []fairCall{
		long(0, 1), long(1, 2), short(0, 3), short(2, 4), // Requests: dispatched at 1, 3, 3, 6
		long(8, 0.5),                                                        // dispatched at 8.5, Requests mode
		short(8.8, 0.5),                                                     // dispatched at 9.3: between patch and switch, counted nowhere
		long(10, 2), short(10, 1), short(11, 1), short(12, 1), short(13, 1), // Tokens
		short(19, 2), // dispatched at 21, after the load: counted nowhere
		{Tenant: "stark", Start: sec(15), Wait: -1, End: sec(15.1), Status: 429, Outcome: outcomeRefused, Cause: "tenant_limit"},
	}
	sims := []simSample{
		{T: sec(1), OK: true, Tenants: map[string]simTokens{"lexcorp": {2000, 100}}},
		{T: sec(2), OK: false},
		{T: sec(25), OK: true, Tenants: map[string]simTokens{"lexcorp": {8000, 400}, "stark": {400, 800}}},
	}
	samples := []sample{
		{OK: true, T: sec(5), FairGap: map[string]float64{}},
		{OK: true, T: sec(11), FairGap: map[string]float64{"standard": 2200}, FairGapBound: map[string]float64{}, BytesPerToken: 3.99},
		{OK: true, T: sec(11.5), BytesPerToken: 4},
		{OK: true, T: sec(12), FairGap: map[string]float64{"standard": 450}, FairGapBound: map[string]float64{}},
		{OK: false, T: sec(13), FairGap: map[string]float64{"standard": 99999}},
	}
	return f, calls, sims, samples
}

func TestSummarizeFairRun(t *testing.T) {
	f, calls, sims, samples := fairFixture()
	got := summarizeFairRun(f, calls, sims, samples, 2)
	want := []fairMode{
		{Mode: "Requests", FromSeconds: 0, ToSeconds: 9, JainTokens: jain([]float64{3 * 2200, 2 * 250}), Tenants: []fairModeTenant{
			{Tenant: "lexcorp", Requests: 3, PromptTokens: 6000, CompletionTokens: 300, WeightedTokens: 6600, Share: 6600.0 / 7100, WaitP50: 1, WaitP99: 2},
			{Tenant: "stark", Requests: 2, PromptTokens: 100, CompletionTokens: 200, WeightedTokens: 500, Share: 500.0 / 7100, WaitP50: 3, WaitP99: 4},
		}},
		{Mode: "Tokens", FromSeconds: 10, ToSeconds: 20, JainTokens: jain([]float64{2200, 1000}), Tenants: []fairModeTenant{
			{Tenant: "lexcorp", Requests: 1, PromptTokens: 2000, CompletionTokens: 100, WeightedTokens: 2200, Share: 2200.0 / 3200, WaitP50: 2, WaitP99: 2},
			{Tenant: "stark", Requests: 4, PromptTokens: 200, CompletionTokens: 400, WeightedTokens: 1000, Share: 1000.0 / 3200, WaitP50: 1, WaitP99: 1},
		}},
	}
	approx := cmpopts.EquateApprox(0, 1e-12)
	if diff := cmp.Diff(want, got.Modes, approx); diff != "" {
		t.Errorf("modes (-want +got):\n%s", diff)
	}
	type totals struct {
		Requests, OK                   int
		NotOK                          map[string]int
		GapMax, GapBound, GapBoundMetr float64
		GapSamples, Switched           int
		BytesPerToken                  float64
		Served, Usage                  map[string]simTokens
	}
	gotT := totals{got.Requests, got.OK, got.NotOK, got.GapMax, got.GapBound, got.GapBoundMetric, got.GapSamples, got.Switched, got.BytesPerToken, got.Served, got.Usage}
	// 8,000 bytes at 3.99 a token reserve 2,006 prompt tokens.
	wantT := totals{Requests: 13, OK: 12, NotOK: map[string]int{"429 tenant_limit": 1}, GapMax: 2200, GapBound: 2206, GapSamples: 2, Switched: 2, BytesPerToken: 3.99,
		Served: map[string]simTokens{"lexcorp": {8000, 400}, "stark": {400, 800}},
		Usage:  map[string]simTokens{"lexcorp": {8000, 400}, "stark": {400, 800}}}
	if diff := cmp.Diff(wantT, gotT); diff != "" {
		t.Errorf("totals (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]fairTenantPlan{
		{Tenant: "lexcorp", Role: "long prompts: 2,000 tokens", PromptTokens: 2000, Cost: 2200, Reserved: 2206, ServiceSeconds: 4.4},
		{Tenant: "stark", Role: "short prompts: 50 tokens", PromptTokens: 50, Cost: 250, Reserved: 251, ServiceSeconds: 0.5},
	}, got.Tenants, approx); diff != "" {
		t.Errorf("tenants (-want +got):\n%s", diff)
	}
}

// A switch that never reached every dispatcher has no Tokens window.
func TestSummarizeFairRunWithoutSwitch(t *testing.T) {
	f, calls, sims, samples := fairFixture()
	f.switchedAt, f.switched, f.loadEnd = 0, 1, 0
	got := summarizeFairRun(f, calls, sims, samples[:1], 2)
	if got.BytesPerToken != 0 || got.GapBound != 2200 {
		t.Errorf("without a ratio reported: bytes per token %v, gap bound %v; want 0 and 2200 at the default ratio", got.BytesPerToken, got.GapBound)
	}
	if len(got.Modes) != 1 || got.Modes[0].Mode != policy.FairnessRequests || got.SwitchedAt != 0 || got.Switched != 1 {
		t.Errorf("modes %+v, switched at %v by %d", got.Modes, got.SwitchedAt, got.Switched)
	}
	if md := fairMarkdown(got); !strings.Contains(md, "did **not** reach every dispatcher (1 of 2)") {
		t.Errorf("the section does not say the switch failed:\n%s", md)
	}
}

func TestFairMarkdownAndChart(t *testing.T) {
	f, calls, sims, samples := fairFixture()
	s := summarizeFairRun(f, calls, sims, samples, 2)
	md := fairMarkdown(s)
	for _, want := range []string{
		"## Token fairness within a tier",
		"| Requests | 0s–9s | 0.575 | lexcorp | 3 | 6000 | 300 | 6600 | 93.0% | 1.00s | 2.00s |",
		"| Tokens | 10s–20s | 0.877 | stark | 4 | 200 | 400 | 1000 | 31.2% | 1.00s | 1.00s |",
		"12 of 13 requests were answered 200; the rest: 429 tenant_limit 1",
		"of 2 samples was 2200 weighted tokens, against the bound of 2206, the largest cost charged at dispatch",
		"learned 3.990 bytes a token",
		"2 of 2 dispatchers held Tokens 1s later",
		"](token-fairness.png)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
	file := filepath.Join(t.TempDir(), chartFair)
	if err := drawFair(file, s, calls, sims, samples, f.weights); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	img, err := png.Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 800 {
		t.Errorf("chart %dx%d, want two panels of at least 800 wide", b.Dx(), b.Dy())
	}
}

// The dashed lines step up by each answered request's weighted tokens at
// its dispatch time; refusals and requests never dispatched are left out.
func TestDispatchedTokens(t *testing.T) {
	_, calls, _, _ := fairFixture()
	w := policy.Fairness{InputWeight: 1, OutputWeight: 2}
	got := dispatchedTokens("lexcorp", calls, w)
	want := plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 0}, {X: 1, Y: 2200}, {X: 3, Y: 2200}, {X: 3, Y: 4400}, {X: 8.5, Y: 4400}, {X: 8.5, Y: 6600}, {X: 12, Y: 6600}, {X: 12, Y: 8800}}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := dispatchedTokens("nobody", calls, w); got != nil {
		t.Errorf("a tenant without answers: %v, want nil", got)
	}
}

// Every prompt the demo sends is a whole number of simserver's 4-byte
// tokens, so the dispatchers' bytes-per-token ratio stays at 4 and the
// token-fairness phase's gap bound is exact (see requestBody).
func TestPromptsAreWholeTokens(t *testing.T) {
	var body struct {
		Messages []struct{ Content string } `json:"messages"`
	}
	if err := json.Unmarshal([]byte(requestBody), &body); err != nil || len(body.Messages) != 1 || body.Messages[0].Content != shortPrompt {
		t.Fatalf("requestBody %s: %v", requestBody, err)
	}
	sizes := map[string]int{"short prompt": len(shortPrompt)}
	for _, s := range append(defaultPlan(), zeroPlan()...) {
		if s.Budget != nil {
			sizes[s.Name] = len(s.Budget.prompt())
		}
	}
	for _, ft := range fairTenants() {
		sizes[ft.Name] = len(ft.prompt())
	}
	for name, n := range sizes {
		if n%bytesPerToken != 0 {
			t.Errorf("%s: %d bytes, not a whole number of %d-byte tokens", name, n, bytesPerToken)
		}
	}
	if len(sizes) != 4 {
		t.Errorf("prompts checked: %v", sizes)
	}
}
