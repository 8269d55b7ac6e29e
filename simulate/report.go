package simulate

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// HorizonWarning is what simulate prints when the ModelPool would carry the
// controller's AgeingHorizonExceedsClientTimeout condition: the condition
// type, then the controller's own condition message.
func HorizonWarning(pool capacity.PoolBounds) string {
	return v1alpha1.ModelPoolAgeingHorizonExceedsClientTimeout + ": " + capacity.HorizonMessage(pool)
}

// warnings lists what the user should know about the configuration and the
// run, in a fixed order.
func (e *engine) warnings() []string {
	var out []string
	b := e.first
	pool := b.Pool
	if pool.HorizonExceedsClientTimeout {
		out = append(out, HorizonWarning(pool))
	}
	for _, t := range b.Tiers {
		if t.MaxWaitExceedsClientTimeout {
			out = append(out, fmt.Sprintf("tier %s: the stated maxWait %s exceeds clientTimeout %s: under sustained overload its requests may expire instead of being served",
				t.Name, t.MaxWait, pool.ClientTimeout))
		}
	}
	for _, name := range e.res.order {
		tr := e.res.Tiers[name]
		if tr.UnderLimits.Count > 0 && !tr.UnderLimits.WithinMaxWait {
			out = append(out, fmt.Sprintf("tier %s: a request of a tenant under its own limits waited %.3fs, more than the stated maxWait %.3fs",
				name, tr.UnderLimits.MaxWait, tr.MaxWait))
		}
	}
	for _, q := range b.Tenants {
		switch {
		case q.TierNotFound:
			out = append(out, fmt.Sprintf("TenantQuota %s: tier %q is not a tier of this pool: the quota is not in force", q.QuotaName, q.Tier))
		case q.Duplicate:
			out = append(out, fmt.Sprintf("TenantQuota %s: tenant %q is already claimed by TenantQuota %s: the quota is not in force", q.QuotaName, q.Tenant, q.DuplicateOf))
		}
	}
	m, from := e.sampler.mean, ""
	if e.rates != nil && e.serviceN > 0 {
		m, from = e.serviceSum/float64(e.serviceN), " (from its tokens and the pool's token rates)"
	}
	if math.Abs(m-pool.ServiceTime.Seconds()) > 0.01*pool.ServiceTime.Seconds() {
		out = append(out, fmt.Sprintf("the Load's mean service time %s%s differs from the pool's %s (%s): the request bounds assume the pool's",
			secs(m).Round(time.Millisecond), from, pool.ServiceTime, pool.ServiceTimeSource))
	}
	if pool.ServiceTimeSource == v1alpha1.ServiceTimeMeasured {
		out = append(out, "serviceTime.source is Measured: the simulator keeps the declared mean (it does not model the controller's measurement loop)")
	}
	if idle := e.idleDispatchers(); idle > 0 {
		out = append(out, fmt.Sprintf("Load spec.dispatchers %d exceeds the pool's %d slots: %d of the dispatchers get no slot and refuse every request sent to them with 503 unavailable",
			len(e.first.Policies), pool.Concurrency, idle))
	}
	return append(out, e.zeroWarnings()...)
}

// WriteJSON writes the result as one indented JSON object.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the tables people read.
func WriteText(w io.Writer, r *Result) error {
	p := r.Policy
	ct := "none"
	if p.ClientTimeoutSeconds > 0 {
		ct = fmtSecs(p.ClientTimeoutSeconds)
	}
	fmt.Fprintf(w, "Pool %s: %d replicas, %d slots, service time %s, μ %g req/s, ageing %s per point (horizon %s), clientTimeout %s\n",
		r.Pool, p.Replicas, p.Slots, fmtSecs(p.ServiceTimeSeconds), p.ServiceRate, fmtSecs(p.AgeingRateSeconds), fmtSecs(p.AgeingHorizonSeconds), ct)
	fmt.Fprintf(w, "Simulated %s with seed %d; the first %s are warm-up, figures cover the remaining %s. Utilisation %.1f%%.\n",
		fmtSecs(r.SimulatedSeconds), r.Seed, fmtSecs(r.WarmupSeconds), fmtSecs(r.MeasuredSeconds), 100*r.Utilisation)
	fmt.Fprintf(w, "Goodput %.3f req/s (answers received); wasted service %.1f slot-seconds (generations for clients that had left).\n\n",
		r.Goodput, r.WastedServiceSeconds)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := r.figuresHead()
	jainTok := ""
	if r.tokens {
		jainTok = "JAIN TOK\t"
	}
	fmt.Fprintln(tw, "TIER\t"+head+"SLO\tJAIN\t"+jainTok)
	for _, name := range r.tierOrder() {
		t := r.Tiers[name]
		fmt.Fprintf(tw, "%s\t%s%.1f%%\t%.3f\t%s\n", name, r.figuresRow(&t.Figures), 100*t.SLOAttainment, t.Jain, r.jainTokensCell(t))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nStated (per tier, pool-wide) next to observed:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tBOUND\tMAX QUEUED\tTENANT LIMIT\tTENANT QUEUE\tMAXWAIT\tUNDER-LIMIT WAITS\tMAX OF THEM\tHELD\tMEAN QUEUE\tλ×W\t")
	for _, name := range r.tierOrder() {
		t := r.Tiers[name]
		held := "yes"
		switch {
		case t.UnderLimits.Count == 0:
			held = "-"
		case !t.UnderLimits.WithinMaxWait:
			held = "NO"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\t%.2f\t%.2f\t\n", name, t.Bound, t.MaxQueued, t.TenantLimit, t.TenantQueueLimit,
			fmtSecs(t.MaxWait), t.UnderLimits.Count, fmtSecs(t.UnderLimits.MaxWait), held,
			t.Queue.MeanLength, t.Queue.AdmissionRate*t.Queue.MeanTimeInQueue)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nTenants:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	budgets := ""
	if r.tokens {
		budgets = "BUDGET RPM\tBUDGET TPM\t"
	}
	fmt.Fprintln(tw, "TENANT\tTIER\tLIMIT\tQUEUE LIMIT\t"+budgets+head)
	for _, name := range r.tenantOrder() {
		t := r.Tenants[name]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s%s\n", name, t.Tier, t.TenantLimit, t.QueueLimit, r.budgetCells(t), r.figuresRow(&t.Figures))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	writePolicyChanges(w, r)
	if err := WriteComparison(w, r); err != nil {
		return err
	}
	if len(r.Warnings) > 0 {
		fmt.Fprintln(w)
		for _, s := range r.Warnings {
			fmt.Fprintf(w, "WARNING: %s\n", s)
		}
	}
	return nil
}

// writePolicyChanges lists the recomputed bounds and stated maxWaits; a
// tier refused at zero (bound 0 while held for a cold start) says so.
func writePolicyChanges(w io.Writer, r *Result) {
	if len(r.PolicyChanges) == 0 {
		return
	}
	fmt.Fprintln(w, "\nPolicy changes:")
	for _, c := range r.PolicyChanges {
		refused := map[string]bool{}
		for _, n := range c.RefusedAtZero {
			refused[n] = true
		}
		var bs, ws []string
		for _, name := range r.tierOrder() {
			b := fmt.Sprintf("%s %d", name, c.Bounds[name])
			if refused[name] {
				b += " (refused at zero)"
			}
			bs = append(bs, b)
			if mw, ok := c.MaxWait[name]; ok {
				ws = append(ws, fmt.Sprintf("%s %s", name, fmtSecs(mw)))
			}
		}
		held := ""
		if c.ColdStartSeconds > 0 {
			held = fmt.Sprintf(", held for a cold start of %s", fmtSecs(c.ColdStartSeconds))
		}
		fmt.Fprintf(w, "  at %s: %d replicas, %d slots%s, bounds %s", fmtSecs(c.AtSeconds), c.Replicas, c.Slots, held, strings.Join(bs, ", "))
		if len(ws) > 0 {
			fmt.Fprintf(w, "; maxWait %s", strings.Join(ws, ", "))
		}
		fmt.Fprintln(w)
	}
	writeHeld(w, r)
}

// writeHeld is the table of what each tier held at zero, when the pool was
// ever held for a cold start.
func writeHeld(w io.Writer, r *Result) {
	order := r.tierOrder()
	if len(order) == 0 || r.Tiers[order[0]].HeldAtZero == nil {
		return
	}
	fmt.Fprintln(w, "\nHeld at zero (admitted while the pool had no replica, against the stated maxWait at zero):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tHELD\tDISPATCHED\tEXPIRED\tABANDONED\tREFUSED AT ZERO\tMAX WAIT\tMAXWAIT AT ZERO\tWITHIN\t")
	for _, name := range order {
		h := r.Tiers[name].HeldAtZero
		stated, within := "refused", "-"
		if h.StatedMaxWait > 0 {
			stated = fmtSecs(h.StatedMaxWait)
		}
		if h.Dispatched > 0 {
			within = map[bool]string{true: "yes", false: "NO"}[h.WithinMaxWait]
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", name, h.Held, h.Dispatched, h.Expired, h.Abandoned, h.RefusedAtZero,
			fmtSecs(h.MaxWait), stated, within)
	}
	_ = tw.Flush()
}

// figuresHead is the header of figuresRow's columns. A run with token
// costs or budgets adds the tokens served (and per measured minute) and
// the rate_limited refusals.
func (r *Result) figuresHead() string {
	if !r.tokens {
		return "OFFERED\tREQ/S\tRETRIES\tADMITTED\tSERVED\tTHRU/S\tSHARE\tEXPIRED\tABANDONED\tREF cap\tREF tenant\tREF 503\tWAIT mean\tp50\tp95\tp99\tmax\t"
	}
	return "OFFERED\tREQ/S\tRETRIES\tADMITTED\tSERVED\tTHRU/S\tSHARE\tTOK prompt\tTOK compl\tTOK/MIN\tEXPIRED\tABANDONED\tREF cap\tREF tenant\tREF 503\tREF rate\tWAIT mean\tp50\tp95\tp99\tmax\t"
}

func (r *Result) figuresRow(f *Figures) string {
	served := fmt.Sprintf("%d\t%.3f\t%d\t%d\t%d\t%.3f\t%.1f%%\t",
		f.Offered, f.OfferedRate, f.Retries, f.Admitted, f.Served, f.Throughput, 100*f.ThroughputShare)
	lost := fmt.Sprintf("%d\t%d\t%d\t%d\t%d\t", f.Expired, f.Abandoned, f.Refused.Capacity, f.Refused.TenantLimit, f.Refused.Unavailable)
	waits := fmt.Sprintf("%.2fs\t%.2fs\t%.2fs\t%.2fs\t%.2fs\t", f.Wait.Mean, f.Wait.P50, f.Wait.P95, f.Wait.P99, f.Wait.Max)
	if !r.tokens {
		return served + lost + waits
	}
	tok := fmt.Sprintf("%d\t%d\t%.0f\t", f.TokensServed.Prompt, f.TokensServed.Completion, r.perMinute(f.TokensServed.Total()))
	return served + tok + lost + fmt.Sprintf("%d\t", f.Refused.RateLimited) + waits
}

// jainTokensCell is the tier's jainTokens column, when the run has
// tokens.
func (r *Result) jainTokensCell(t *TierResult) string {
	if !r.tokens {
		return ""
	}
	return fmt.Sprintf("%.3f\t", t.JainTokens)
}

// perMinute is n per minute of the measured window.
func (r *Result) perMinute(n int64) float64 {
	if r.MeasuredSeconds <= 0 {
		return 0
	}
	return float64(n) * 60 / r.MeasuredSeconds
}

// budgetCells are a tenant's budgets in force, "-" for none; nothing when
// the run has no tokens columns.
func (r *Result) budgetCells(t *TenantResult) string {
	if !r.tokens {
		return ""
	}
	cell := func(v int64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprint(v)
	}
	var b policy.Limits
	if t.Budget != nil {
		b = *t.Budget
	}
	return cell(b.RequestsPerMinute) + "\t" + cell(b.TokensPerMinute) + "\t"
}

// tierOrder is by base priority, then name.
func (r *Result) tierOrder() []string {
	if len(r.order) == len(r.Tiers) {
		return r.order
	}
	names := make([]string, 0, len(r.Tiers))
	for n := range r.Tiers {
		names = append(names, n)
	}
	sort.Slice(names, func(a, b int) bool {
		pa, pb := r.Tiers[names[a]].BasePriority, r.Tiers[names[b]].BasePriority
		if pa != pb {
			return pa < pb
		}
		return names[a] < names[b]
	})
	return names
}

// tenantOrder is by tier (base priority), then name.
func (r *Result) tenantOrder() []string {
	rank := map[string]int{}
	for i, n := range r.tierOrder() {
		rank[n] = i
	}
	names := make([]string, 0, len(r.Tenants))
	for n := range r.Tenants {
		names = append(names, n)
	}
	sort.Slice(names, func(a, b int) bool {
		ta, tb := rank[r.Tenants[names[a]].Tier], rank[r.Tenants[names[b]].Tier]
		if ta != tb {
			return ta < tb
		}
		return names[a] < names[b]
	})
	return names
}

// fmtSecs prints seconds as a Go duration rounded to the millisecond.
func fmtSecs(s float64) string {
	return secs(s).Round(time.Millisecond).String()
}
