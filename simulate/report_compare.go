package simulate

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Schedulers lists the result's schedulers: tiergate, then the --compare
// baselines in the order given.
func (r *Result) Schedulers() []string {
	return append([]string{SchedTiergate}, r.compareOrder...)
}

// Of is the result of the named scheduler: r itself for tiergate.
func (r *Result) Of(name string) *Result {
	if name == SchedTiergate {
		return r
	}
	return r.Compare[name]
}

// WriteComparison writes the --compare tables: one line per scheduler for
// the pool, then one table per tier. It writes nothing without baselines.
func WriteComparison(w io.Writer, r *Result) error {
	if len(r.Compare) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nCompared on the same arrivals and service times:")
	for _, name := range r.Schedulers() {
		fmt.Fprintf(w, "  %-15s %s\n", name, Described[name])
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POOL\tGOODPUT/S\tWASTED SLOT-S\tOF BUSY\tUTILISATION\t")
	for _, name := range r.Schedulers() {
		o := r.Of(name)
		of := 0.0
		if o.busySlotSeconds > 0 {
			of = o.WastedServiceSeconds / o.busySlotSeconds
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.1f\t%.1f%%\t%.1f%%\t\n", name, o.Goodput, o.WastedServiceSeconds, 100*of, 100*o.Utilisation)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, tier := range r.tierOrder() {
		if err := writeTierComparison(w, r, tier); err != nil {
			return err
		}
	}
	return nil
}

// writeTierComparison is one tier's figures under every scheduler.
func writeTierComparison(w io.Writer, r *Result, tier string) error {
	t := r.Tiers[tier]
	fmt.Fprintf(w, "\nTier %s (basePriority %d, tolerableWait %s, tiergate's stated maxWait %s):\n",
		tier, t.BasePriority, t.tolerableWait, fmtSecs(t.MaxWait))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	rate := "" // tiergate's budgets, with tokens
	if r.tokens {
		rate = "REF rate\tTOK/MIN\tJAIN TOK\t"
	}
	fmt.Fprintln(tw, "SCHEDULER\tOFFERED\tADMITTED\tSERVED\tTHRU/S\tSHARE\tEXPIRED\tABANDONED\tREF cap\tREF tenant\t"+rate+"SLO\tJAIN\tWAIT mean\tp50\tp95\tp99\tmax\t")
	for _, name := range r.Schedulers() {
		f := r.Of(name).Tiers[tier]
		waits := "-\t-\t-\t-\t-\t" // nothing dispatched for a waiting client
		if f.Wait.Count > 0 {
			waits = fmt.Sprintf("%.2fs\t%.2fs\t%.2fs\t%.2fs\t%.2fs\t", f.Wait.Mean, f.Wait.P50, f.Wait.P95, f.Wait.P99, f.Wait.Max)
		}
		rate := ""
		if r.tokens {
			rate = fmt.Sprintf("%d\t%.0f\t%.3f\t", f.Refused.RateLimited, r.perMinute(f.TokensServed.Total()), f.JainTokens)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.3f\t%.1f%%\t%d\t%d\t%d\t%d\t%s%.1f%%\t%.3f\t%s\n",
			name, f.Offered, f.Admitted, f.Served, f.Throughput, 100*f.ThroughputShare, f.Expired, f.Abandoned,
			f.Refused.Capacity, f.Refused.TenantLimit, rate, 100*f.SLOAttainment, f.Jain, waits)
	}
	return tw.Flush()
}
