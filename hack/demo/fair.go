package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// The token-fairness phase runs last, on the same processes: two tenants
// of the standard tier, lexcorp with prompts 40× stark's and the same
// max_tokens, each with as many closed-loop openai-go workers, first while
// the pool serves the tier by age (fairness mode Requests), then, after
// `kubectl patch modelpool` sets mode Tokens and every dispatcher holds
// it, by their virtual token counters (docs/scheduling.md). The answers'
// usage, the simservers' per-tenant counts and the dispatchers'
// tiergate_fairness_gap_tokens are recorded (fair_report.go).

// The phase's token model. simserver's --prefill-tokens-per-second and
// --decode-tokens-per-second would replace the other phases' lognormal
// service times for every request, so each of this phase's requests asks
// for its own with the ServiceTimeHeader instead: prompt ÷ fairPrefill +
// output ÷ fairDecode, the formula those flags apply. At these rates a slot
// serves fairPrefill weighted tokens a second whatever the mix (an output
// token weighs 2 and takes twice a prompt token's time), so a tenant's
// share of weighted tokens is its share of the slots' time.
const (
	fairPrefill   = 500 // prompt tokens a slot prefills per second
	fairDecode    = 250 // output tokens a slot decodes per second
	fairMaxTokens = 100 // every request's max_tokens, generated in full
	fairWorkers   = 32  // closed-loop workers per tenant: 64 against 24 slots
	fairTier      = "standard"
	// serviceTimeHeader is simserver's per-request service time.
	serviceTimeHeader = "X-Sim-Service-Time"
	// fairShare is the standard tier's tenantShare in the phase: one
	// tenant may hold every slot and queue the tier's whole bound.
	fairShare = "1"
)

// fairTenant is one of the phase's two tenants.
type fairTenant struct {
	Name        string
	Role        string
	PromptBytes int // of prompt text; simserver counts 4 bytes a token
}

func fairTenants() []fairTenant {
	return []fairTenant{
		{Name: "lexcorp", Role: "long prompts: 2,000 tokens", PromptBytes: 8000},
		{Name: "stark", Role: "short prompts: 50 tokens", PromptBytes: 200},
	}
}

// promptTokens is the prompt as simserver counts it (and the dispatcher
// estimates it at its starting ratio).
func (f fairTenant) promptTokens() int64 {
	return int64(math.Ceil(float64(f.PromptBytes) / bytesPerToken))
}

// serviceTime is what a request of the tenant holds its slot for.
func (f fairTenant) serviceTime() time.Duration {
	s := float64(f.promptTokens())/fairPrefill + float64(fairMaxTokens)/fairDecode
	return time.Duration(s * float64(time.Second))
}

func (f fairTenant) prompt() string {
	const words = "Find every clause on liability in the contracts below. "
	return strings.Repeat(words, f.PromptBytes/len(words)+1)[:f.PromptBytes]
}

// fairSchedule is how long each mode's load runs.
type fairSchedule struct {
	Mode  time.Duration // Requests from the start, Tokens from the switch
	Grace time.Duration // after the load, for the queued requests to finish
}

// newFairSchedule: 12s a mode for the short demo, up to 40s.
func newFairSchedule(main time.Duration) fairSchedule {
	return fairSchedule{Mode: min(max(main*2/5, 12*time.Second), 40*time.Second), Grace: 30 * time.Second}
}

// fairCall is one of the phase's requests (an openai-go call without
// retries: one HTTP request).
type fairCall struct {
	Tenant     string
	Start, End time.Duration
	Wait       time.Duration // X-Queue-Wait-Ms; -1 when not dispatched
	Status     int
	Outcome    string
	Cause      string
	// PromptTokens and CompletionTokens are the answer's usage.
	PromptTokens, CompletionTokens int64
}

// simSample is the simservers' served tokens per tenant, summed.
type simSample struct {
	T       time.Duration
	OK      bool
	Tenants map[string]simTokens
}

type simTokens struct {
	Prompt, Completion int64
}

// fairRun is what the phase recorded.
type fairRun struct {
	sched         fairSchedule
	tenants       []fairTenant
	weights       policy.Fairness
	rec           *recorder // for the live table
	obs           *observer
	started       time.Time
	shareCommand  string
	switchCommand string
	patchedAt     time.Duration // the pool's patch to Tokens
	switchedAt    time.Duration // every dispatcher held Tokens; 0: never
	switched      int           // dispatchers seen holding Tokens
	loadEnd       time.Duration
	ended         time.Duration

	mu    sync.Mutex
	calls []fairCall
	sims  []simSample
}

func (f *fairRun) add(c fairCall) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

func (f *fairRun) snapshot() ([]fairCall, []simSample) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fairCall(nil), f.calls...), append([]simSample(nil), f.sims...)
}

// fairPlan names the phase's tenants for checkPlan and the table.
func fairPlan(ts []fairTenant) []streamPlan {
	var out []streamPlan
	for _, t := range ts {
		out = append(out, streamPlan{Name: t.Name, Role: t.Role, Tier: fairTier, Tenants: []string{t.Name}})
	}
	return out
}

// fairPhase runs the phase. Its errors end the demo as the others' do.
func (d *demo) fairPhase(ctx context.Context) error {
	f := &fairRun{sched: newFairSchedule(d.cfg.Duration), tenants: fairTenants()}
	if err := checkPlan(fairPlan(f.tenants), d.pool); err != nil {
		return err
	}
	f.obs = newObserver(d.disps, d.token)
	if err := d.widenShare(ctx, f); err != nil {
		return err
	}
	var p policy.Policy
	if err := f.obs.getJSON(ctx, d.disps[0], "/v1/policy", &p); err != nil {
		return err
	}
	if f.weights = p.FairnessOf(); f.weights.Mode != policy.FairnessRequests {
		return fmt.Errorf("the pool's fairness mode is %s before the phase, the demo expects %s", f.weights.Mode, policy.FairnessRequests)
	}
	d.fair = f
	f.started = time.Now()
	f.rec = newRecorder(f.started, d.cfg.MaxRequests)
	f.obs.setStart(f.started)
	f.obs.scrape(ctx) // the queues' totals before the first request

	issueCtx, stopIssue := context.WithCancel(ctx)
	defer stopIssue()
	reqCtx, cancelReqs := context.WithCancel(ctx)
	defer cancelReqs()
	workersDone := make(chan struct{})
	go func() { defer close(workersDone); d.fairWorkers(issueCtx, reqCtx, f) }()
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); f.obs.run(bgCtx, d.cfg.Refresh) }()
	go func() { defer bg.Done(); d.sampleSims(bgCtx, f, d.cfg.Refresh) }()

	d.ui.logf("token-fairness phase: tenants lexcorp (prompts of %d tokens) and stark (%d), both max_tokens %d, %d openai-go workers each, in tier %s; %s in Requests mode, then Tokens mode for as long",
		f.tenants[0].promptTokens(), f.tenants[1].promptTokens(), fairMaxTokens, fairWorkers, fairTier, f.sched.Mode)
	d.ui.setLive(true)
	runErr := d.fairLoop(ctx, f, workersDone, stopIssue, cancelReqs)
	stopIssue()
	cancelReqs()
	d.awaitRequests(workersDone, " of the token-fairness phase")
	f.ended = f.rec.since()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	awaitIdle(fctx, f.obs)
	d.sampleSimsOnce(fctx, f)
	stopBg()
	bg.Wait()
	d.ui.frame(renderTable(d.fairView(f)))
	d.ui.setLive(false)
	return runErr
}

// fairLoop switches the mode after the first mode's load, stops the load
// a mode's length after every dispatcher holds Tokens, and redraws the
// table until the outstanding requests are done.
func (d *demo) fairLoop(ctx context.Context, f *fairRun, workersDone <-chan struct{}, stopIssue, cancelReqs func()) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastFrame, lastNote time.Duration
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case p := <-d.sup.Exited():
			return fmt.Errorf("%w: %s (pid %d): %v; last log lines:\n%s", ErrExited, p.Name, p.PID, p.err, tail(p.Log, 2048))
		case <-workersDone:
			return nil
		case <-tick.C:
		}
		now := f.rec.since()
		switch {
		case f.patchedAt == 0 && now >= f.sched.Mode:
			if err := d.patchFairness(ctx, f); err != nil {
				stopIssue()
				return err
			}
		case f.patchedAt > 0 && f.switchedAt == 0:
			if n := d.tokensHolders(ctx, f.obs); n == len(d.disps) {
				f.switchedAt, f.switched, f.loadEnd = now, n, now+f.sched.Mode
				d.ui.event(now, "every dispatcher (%d/%d) holds fairness Tokens, %.2fs after the patch; the same load runs %s more", n, len(d.disps), (now - f.patchedAt).Seconds(), f.sched.Mode)
			} else if now-f.patchedAt > 30*time.Second {
				f.switched = n
				stopIssue()
				return fmt.Errorf("only %d of %d dispatchers hold fairness Tokens 30s after the patch", n, len(d.disps))
			}
		case f.loadEnd > 0 && now >= f.loadEnd:
			stopIssue()
			if now >= f.loadEnd+f.sched.Grace {
				cancelReqs()
			}
		}
		if now-lastNote >= 5*time.Second {
			lastNote = now
			d.noteTokens(f, now)
		}
		if now-lastFrame >= d.cfg.Refresh {
			lastFrame = now
			d.ui.frame(renderTable(d.fairView(f)))
		}
	}
}

// widenShare sets the standard tier's tenantShare to 1 and waits until
// every dispatcher holds it: at its 0.10 a tenant may queue only 4
// requests at each dispatcher, too few for closed-loop workers to keep
// the tier backlogged without refusals. The tier's other tenants are idle
// by now.
func (d *demo) widenShare(ctx context.Context, f *fairRun) error {
	patch := fmt.Sprintf(`{"spec":{"tenantShare":"%s"}}`, fairShare)
	args := []string{"-n", d.pool.Namespace, "patch", "servicetier", fairTier, "--type=merge", "-p", patch}
	out, err := d.k.kubectl(ctx, args...)
	if err != nil {
		return err
	}
	f.shareCommand = "kubectl " + strings.Join(args[:len(args)-1], " ") + " '" + patch + "'"
	d.ui.logf("%s\n%s", f.shareCommand, indent(out))
	return d.awaitPolicies(ctx, f.obs, "the standard tier's tenantShare of 1", func(p policy.Policy) bool {
		for _, t := range p.Tiers {
			if t.Name == fairTier {
				return t.TenantConcurrencyLimit >= p.Slots && t.TenantQueueLimit >= t.QueueBound
			}
		}
		return false
	})
}

// patchFairness switches the pool to Tokens mode.
func (d *demo) patchFairness(ctx context.Context, f *fairRun) error {
	patch := `{"spec":{"fairness":{"mode":"Tokens"}}}`
	args := []string{"-n", d.pool.Namespace, "patch", "modelpool", d.pool.Name, "--type", "merge", "-p", patch}
	f.patchedAt = f.rec.since()
	out, err := d.k.kubectl(ctx, args...)
	if err != nil {
		return err
	}
	f.switchCommand = "kubectl " + strings.Join(args[:len(args)-1], " ") + " '" + patch + "'"
	d.ui.event(f.patchedAt, "%s: %s", f.switchCommand, strings.TrimSpace(out))
	return nil
}

// tokensHolders counts the dispatchers whose applied policy is in Tokens
// mode.
func (d *demo) tokensHolders(ctx context.Context, o *observer) int {
	n := 0
	for _, ref := range d.disps {
		var p policy.Policy
		if err := o.getJSON(ctx, ref, "/v1/policy", &p); err == nil && p.FairnessOf().Mode == policy.FairnessTokens {
			n++
		}
	}
	return n
}

// awaitPolicies waits up to 30s until every dispatcher's policy passes ok.
func (d *demo) awaitPolicies(ctx context.Context, o *observer, what string, ok func(policy.Policy) bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := 0
		for _, ref := range d.disps {
			var p policy.Policy
			if err := o.getJSON(ctx, ref, "/v1/policy", &p); err == nil && ok(p) {
				n++
			}
		}
		if n == len(d.disps) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d dispatchers hold %s after 30s", n, len(d.disps), what)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fairWorkers runs every tenant's closed-loop workers until issueCtx
// ends; each request runs to its end unless reqCtx ends first.
func (d *demo) fairWorkers(issueCtx, reqCtx context.Context, f *fairRun) {
	hc := &http.Client{Transport: &serviceTransport{base: newTransport(), targets: d.dataTargets()}}
	var wg sync.WaitGroup
	for _, t := range f.tenants {
		c := openai.NewClient(
			option.WithBaseURL("http://"+serviceHost+"/v1/"),
			option.WithHTTPClient(hc),
			option.WithAPIKey("demo-unused"),
			option.WithHeader(d.pool.TenantHeader, t.Name),
			option.WithHeader(serviceTimeHeader, t.serviceTime().String()),
			option.WithMaxRetries(0), // every HTTP request is recorded as it was answered
		)
		params := openai.ChatCompletionNewParams{
			Model:     "sim-model",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(t.prompt())},
			MaxTokens: openai.Int(fairMaxTokens),
		}
		for range fairWorkers {
			wg.Go(func() {
				for issueCtx.Err() == nil && f.rec.take() {
					f.add(f.call(reqCtx, &c, t.Name, params))
				}
			})
		}
	}
	wg.Wait()
}

// call sends one request and records it.
func (f *fairRun) call(reqCtx context.Context, c *openai.Client, tenant string, params openai.ChatCompletionNewParams) fairCall {
	ctx, cancel := context.WithTimeout(reqCtx, 2*time.Minute)
	defer cancel()
	fc := fairCall{Tenant: tenant, Start: f.rec.since(), Wait: -1}
	f.rec.begin(fairTier)
	var resp *http.Response
	res, err := c.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp))
	fc.End = f.rec.since()
	if resp != nil {
		fc.Status = resp.StatusCode
		if w, ok := waitHeader(resp); ok {
			fc.Wait = w
			f.rec.wait(waitSample{Tier: fairTier, Tenant: tenant, Dispatch: fc.Start + w, Wait: w})
		}
	}
	var apiErr *openai.Error
	switch {
	case err == nil:
		fc.Outcome = outcomeServed
		fc.PromptTokens, fc.CompletionTokens = res.Usage.PromptTokens, res.Usage.CompletionTokens
	case reqCtx.Err() != nil:
		fc.Outcome, fc.Cause = outcomeCut, "demo ended"
	case errors.As(err, &apiErr):
		fc.Outcome, fc.Cause = outcomeRefused, apiErr.Type
		if fc.Cause == "" {
			fc.Cause = http.StatusText(apiErr.StatusCode)
		}
	default:
		fc.Outcome, fc.Cause = outcomeError, err.Error()
	}
	f.rec.end(record{Stream: tenant, Tenant: tenant, Tier: fairTier, Client: "openai-go", Start: fc.Start, End: fc.End, Status: fc.Status, Outcome: fc.Outcome, Cause: fc.Cause})
	return fc
}

// sampleSims reads the simservers' per-tenant tokens every period.
func (d *demo) sampleSims(ctx context.Context, f *fairRun, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		d.sampleSimsOnce(ctx, f)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// simStats is the part of simserver's GET /debug/stats read here.
type simStats struct {
	Tenants map[string]struct {
		PromptTokens     int64 `json:"promptTokens"`
		CompletionTokens int64 `json:"completionTokens"`
	} `json:"tenants"`
}

func (d *demo) sampleSimsOnce(ctx context.Context, f *fairRun) {
	s := simSample{T: f.rec.since(), OK: true, Tenants: map[string]simTokens{}}
	// The one simserver behind every model pod counts them all.
	var st simStats
	if err := getJSONFrom(ctx, f.obs.client, "http://"+d.simAddr+"/debug/stats", &st); err != nil {
		s.OK = false
	}
	for _, t := range f.tenants {
		c := st.Tenants[t.Name]
		s.Tenants[t.Name] = simTokens{Prompt: c.PromptTokens, Completion: c.CompletionTokens}
	}
	f.mu.Lock()
	f.sims = append(f.sims, s)
	f.mu.Unlock()
}

// noteTokens puts the weighted tokens served so far in the event log.
func (d *demo) noteTokens(f *fairRun, now time.Duration) {
	_, sims := f.snapshot()
	last, ok := lastSim(sims)
	if !ok {
		return
	}
	var parts []string
	var total float64
	for _, t := range f.tenants {
		total += weighted(f.weights, last.Tenants[t.Name])
	}
	for _, t := range f.tenants {
		w := weighted(f.weights, last.Tenants[t.Name])
		share := 0.0
		if total > 0 {
			share = w / total
		}
		parts = append(parts, fmt.Sprintf("%s %.0f (%.0f%%)", t.Name, w, 100*share))
	}
	mode := policy.FairnessRequests
	if f.switchedAt > 0 {
		mode = policy.FairnessTokens
	}
	d.ui.event(now, "%s mode; weighted tokens served so far (simservers): %s", mode, strings.Join(parts, ", "))
}

// fairView is the live table during the phase.
func (d *demo) fairView(f *fairRun) tableView {
	s, ok := f.obs.latest()
	load := 2*f.sched.Mode + time.Second
	if f.loadEnd > 0 {
		load = f.loadEnd
	}
	ready, spec := d.readyNow()
	mode := "token fairness, Requests mode"
	if f.patchedAt > 0 {
		mode = "token fairness, switching to Tokens mode"
	}
	if f.switchedAt > 0 {
		mode = "token fairness, Tokens mode"
	}
	return tableView{
		Now: f.rec.since(), Load: load, Grace: f.sched.Grace, Phase: mode,
		Pool: d.pool.Namespace + "/" + d.pool.Name, Ready: ready, Replicas: spec, PerReplica: d.pool.PerReplica,
		Sample: s, HaveSample: ok, Tiers: []string{fairTier}, Live: f.rec.live(waitWindow), Dispatchers: len(d.disps),
		Events: d.ui.lastEvents(8), ServiceTime: fmt.Sprintf("prompt ÷ %d + output ÷ %d tokens/s (X-Sim-Service-Time)", fairPrefill, fairDecode), WaitWindow: waitWindow,
	}
}

// getJSONFrom GETs url (a simserver's, which needs no token) into v.
func getJSONFrom(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}
