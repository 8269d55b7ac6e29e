package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// markdown writes README.md of the report from the summary.
func markdown(s *summary, kubectlGet string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# tiergate demo report\n\n")
	w("Written by `make demo` (`hack/demo`) for a run started %s. Load was offered for %s, then outstanding requests had up to %s to finish; the run's load phase ended at %s.\n\n",
		s.StartedAt.Format(time.RFC3339), secondsD(s.LoadSeconds), secondsD(s.GraceSeconds), clock(time.Duration(s.EndedSeconds*float64(time.Second))))
	if s.Interrupted {
		w("**The run was interrupted (Ctrl-C or SIGTERM); these are the numbers up to that point.**\n\n")
	}
	if s.Error != "" {
		w("**The run failed:** `%s`\n\n", oneLine(s.Error))
	}
	w("Everything ran on this machine: a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler from `bin/k8s`, kwok playing the pods on fake Nodes, `tiergate controller` (leader election, push token), 2 `tiergate dispatcher` processes on their pods' addresses and one simserver process behind the %d model pods' addresses on %s (see [The cluster that ran](#the-cluster-that-ran)). ", s.Replicas, s.Subnet)
	w("The model server is **simserver, a stand-in for vLLM** (it streams placeholder tokens), with service time `%s`; pool %s has %d replicas × %d concurrent generations = %d slots and a client timeout of %s. ",
		s.ServiceTime, s.Pool, s.Replicas, s.PerReplica, int(s.Replicas)*s.PerReplica, secondsD(s.ClientTimeout))
	w("Waits are client-side unless marked server-side: the `X-Queue-Wait-Ms` header of each dispatched request. Every HTTP request counts, the openai-go client's retries included.\n\n")

	b.WriteString(clusterMarkdown(s.Cluster))
	w("## What the numbers show\n\n")
	for _, f := range findings(s) {
		w("- %s\n", f)
	}
	w("\n")

	w("## Per tier\n\n")
	w("| tier | requests | served | refused | refusals by cause | cut at the end | errors | wait p50 | p95 | p99 | max | queue bound (start → lowest → end) |\n")
	w("|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|---|\n")
	for _, t := range s.Tiers {
		w("| %s | %d | %d | %d | %s | %d | %d | %s | %s | %s | %s | %d → %d → %d |\n", t.Tier, t.Requests, t.Served, t.Refused, causes(t.RefusedByCause),
			t.Cut, t.Errors, fmtSecondsN(t.WaitP50, t.Dispatched), fmtSecondsN(t.WaitP95, t.Dispatched), fmtSecondsN(t.WaitP99, t.Dispatched),
			fmtSecondsN(t.WaitMax, t.Dispatched), t.BoundStart, t.BoundMin, t.BoundEnd)
	}
	w("\nServer-side, from the dispatchers' `/metrics` (summed over both; wait percentiles are estimated from the histogram buckets the way `histogram_quantile` does):\n\n")
	w("| tier | 200 responses | refusals by cause (`tiergate_rejections_total`) | client gone (499) | dispatched | wait p50 | wait p95 |\n")
	w("|---|--:|---|--:|--:|--:|--:|\n")
	for _, t := range s.Tiers {
		w("| %s | %.0f | %s | %.0f | %.0f | %s | %s |\n", t.Tier, t.ServerOK, causesF(t.ServerRefusedByCause), t.ServerClientGone, t.ServerWaitCount,
			fmtSeconds(t.ServerWaitP50), fmtSeconds(t.ServerWaitP95))
	}

	w("\n## Per stream\n\n")
	w("| stream | what it is | tier | requests | served | refusals by cause | not sent (client-side cap) | wait p50 | wait p95 |\n")
	w("|---|---|---|--:|--:|---|--:|--:|--:|\n")
	for _, st := range s.Streams {
		w("| %s | %s | %s | %d | %d | %s | %d | %.2fs | %.2fs |\n", st.Name, st.Role, st.Tier, st.Requests, st.Served, causes(st.RefusedByCause), st.NotSent, st.WaitP50, st.WaitP95)
	}

	w("\n## Scale events\n\n")
	if len(s.ScaleEvents) == 0 {
		w("None happened (the run ended first).\n")
	}
	for _, e := range s.ScaleEvents {
		w("### %s: %d → %d replicas\n\n", clock(time.Duration(e.AtSeconds*float64(time.Second))), e.From, e.To)
		w("The autoscaler wrote spec.replicas (%d afterwards, owned by %s):\n\n```\n%s\n```\n\n", e.SpecReplicas, joinOrNone(e.ReplicasOwners), e.Command)
		verb := "created"
		if e.To < e.From {
			verb = "deleted"
		}
		w("The ReplicaSet controller %s pods %s. ", verb, joinOrNone(e.Pods))
		if e.Ready {
			w("The Deployment's status counted %d ready replicas %.2fs after the command.\n\n", e.To, e.ReadyAfterSeconds)
		} else {
			w("The Deployment's status did **not** count %d ready replicas within 30s.\n\n", e.To)
		}
		if e.Error != "" {
			w("Error: `%s`\n\n", oneLine(e.Error))
		}
		if !e.Followed {
			w("The dispatchers did **not** reach %d slots within 30s (they held %d).\n\n", int(e.To)*s.PerReplica, e.SlotsAfter)
			continue
		}
		w("%.2fs after the command both dispatchers held the new policy: slots %d → %d.\n\n", e.FollowedAfterSeconds, e.SlotsBefore, e.SlotsAfter)
		w("The dispatchers' numbers, summed (each holds half the pool, and a per-dispatcher limit is never below 1, so a sum can exceed the pool-wide limit the ServiceTier status shows):\n\n")
		w("| tier | queue bound before | after | tenant concurrency limit before | after |\n|---|--:|--:|--:|--:|\n")
		for _, t := range s.Tiers {
			w("| %s | %d | %d | %d | %d |\n", t.Tier, e.BoundsBefore[t.Tier], e.BoundsAfter[t.Tier], e.TenantLimitsBefore[t.Tier], e.TenantLimitsAfter[t.Tier])
		}
		if e.ServiceTiers != "" {
			status := "shows the same bounds"
			if !e.StatusFollowed {
				status = "had not caught up within 30s"
			}
			w("\nThe controller's ServiceTier status %s (`kubectl get servicetiers`):\n\n```\n%s\n```\n", status, e.ServiceTiers)
		}
		w("\n")
	}

	w("\n## By pool size\n\n")
	w("| phase | tier | dispatched | dispatched/s | wait p95 | refusals by cause |\n|---|---|--:|--:|--:|---|\n")
	for _, p := range s.Phases {
		w("| %s (%s–%s) | %s | %d | %.2f | %s | %s |\n", p.Phase, clock(time.Duration(p.FromSeconds*float64(time.Second))), clock(time.Duration(p.ToSeconds*float64(time.Second))),
			p.Tier, p.Dispatched, p.PerSecond, fmtSecondsN(p.WaitP95, p.Dispatched), causes(p.RefusedByCause))
	}

	o := s.OpenAI
	w("\n## The openai-go client\n\n")
	w("Tenant `%s`, %d workers, each calling `Chat.Completions.New` in a loop with `option.WithMaxRetries(%d)`. ", o.Tenant, o.Workers, openaiRetries)
	w("%d calls made %d HTTP attempts; %d succeeded (%d of them after retrying), %d failed after their retries, %d were cut at the end. ",
		o.Calls, o.Attempts, o.Succeeded, o.SucceededAfteRetry, o.Failed, o.Cut)
	if o.RetriesAfterHeader > 0 {
		w("%d retries followed a refusal carrying `Retry-After` (up to %ds); %d of them waited at least that long (the shortest wait was %.2f× the header). ",
			o.RetriesAfterHeader, o.MaxRetryAfter, o.Honoured, o.MinGapRatio)
	} else {
		w("No attempt was refused with `Retry-After`, so there was nothing to honour. ")
	}
	w("%d retries followed answers without the header (the client's own backoff).\n", o.OtherRetries)

	if s.Budget != nil {
		b.WriteString(budgetMarkdown(s.Budget))
	}
	if s.Zero != nil {
		b.WriteString(zeroMarkdown(s.Zero))
	}
	if s.Fair != nil {
		b.WriteString(fairMarkdown(s.Fair))
	}

	w("\n## Charts\n\n")
	w("![Queue wait per tier over time](%s)\n\n![Refusals by cause over time](%s)\n\n![Queue length and bound per tier over time](%s)\n", chartWaits, chartRefusals, chartQueueBound)

	w("\n## The cluster at the end\n\n")
	if len(s.Conditions) > 0 {
		w("ModelPool conditions:\n\n| type | status | reason | message |\n|---|---|---|---|\n")
		for _, c := range s.Conditions {
			w("| %s | %s | %s | %s |\n", c.Type, c.Status, c.Reason, strings.ReplaceAll(oneLine(c.Message), "|", "\\|"))
		}
		w("\n")
	}
	if len(s.Events) > 0 {
		w("Events of the pool, tiers and quotas:\n\n```\n%s\n```\n\n", strings.Join(s.Events, "\n"))
	}
	if kubectlGet != "" {
		w("`kubectl get modelpools,servicetiers,tenantquotas`:\n\n```\n%s\n```\n\n", kubectlGet)
	}
	w("The demo started %d processes (control plane included) and stopped all of them. The logs of each are in `logs/`.\n", s.Processes)
	return b.String()
}

// findings are the report's conclusions, each computed from the numbers.
func findings(s *summary) []string {
	var out []string
	tier := map[string]tierSummary{}
	for _, t := range s.Tiers {
		tier[t.Tier] = t
	}
	out = append(out, tierOrderFinding(s)...)
	// The noisy tenant.
	var noisy, steady *streamSummary
	for i := range s.Streams {
		switch s.Streams[i].Name {
		case "umbrella":
			noisy = &s.Streams[i]
		case "acme":
			steady = &s.Streams[i]
		}
	}
	if noisy != nil && steady != nil && noisy.Requests > 0 {
		nl := noisy.RefusedByCause["tenant_limit"]
		msg := fmt.Sprintf("The noisy premium tenant umbrella sent %d requests; %d (%.0f%%) were refused with 429 tenant_limit and %d served (p95 wait %.2fs). ",
			noisy.Requests, nl, 100*float64(nl)/float64(noisy.Requests), noisy.Served, noisy.WaitP95)
		sl := steady.RefusedByCause["tenant_limit"] + steady.RefusedByCause["capacity"]
		if sl == 0 {
			msg += fmt.Sprintf("The steady premium tenant acme, in the same tier, had no 429 at all and a p95 wait of %.2fs: the per-tenant cap kept one customer from taking the tier.", steady.WaitP95)
		} else {
			msg += fmt.Sprintf("The steady premium tenant acme got %d 429s of %d requests (p95 wait %.2fs).", sl, steady.Requests, steady.WaitP95)
		}
		out = append(out, msg)
	}
	// Scale events.
	for _, e := range s.ScaleEvents {
		at := clock(time.Duration(e.AtSeconds * float64(time.Second)))
		if !e.Followed {
			out = append(out, fmt.Sprintf("At %s the pool went %d→%d replicas, and the dispatchers did **not** follow within 30s.", at, e.From, e.To))
			continue
		}
		var ch []string
		for _, t := range s.Tiers {
			ch = append(ch, fmt.Sprintf("%s %d→%d", t.Tier, e.BoundsBefore[t.Tier], e.BoundsAfter[t.Tier]))
		}
		st := ""
		if e.StatusFollowed {
			st = " ServiceTier status showed the same numbers."
		}
		out = append(out, fmt.Sprintf("At %s `kubectl scale` took the Deployment from %d to %d replicas; its status counted them ready %.2fs later, and %.2fs after the command the dispatchers held %d slots (was %d) and queue bounds %s.%s",
			at, e.From, e.To, e.ReadyAfterSeconds, e.FollowedAfterSeconds, e.SlotsAfter, e.SlotsBefore, strings.Join(ch, ", "), st))
	}
	// The bottom tier while scaled down.
	if len(s.Tiers) > 0 && len(s.ScaleEvents) > 0 {
		bottom := s.Tiers[len(s.Tiers)-1].Tier
		var full, half *phaseSummary
		for i := range s.Phases {
			p := &s.Phases[i]
			if p.Tier != bottom {
				continue
			}
			if p.Replicas == s.Replicas && full == nil {
				full = p
			}
			if p.Replicas < s.Replicas && half == nil {
				half = p
			}
		}
		if full != nil && half != nil {
			total := func(phase string) float64 {
				sum := 0.0
				for _, p := range s.Phases {
					if p.Phase == phase {
						sum += p.PerSecond
					}
				}
				return sum
			}
			tf, th := total(full.Phase), total(half.Phase)
			msg := fmt.Sprintf("Dispatches fell from %.2f/s with %d replicas to %.2f/s with %d; the %s tier's from %.2f/s to %.2f/s",
				tf, full.Replicas, th, half.Replicas, bottom, full.PerSecond, half.PerSecond)
			if loss := tf - th; loss > 0 {
				msg += fmt.Sprintf(", %.0f%% of the loss", 100*(full.PerSecond-half.PerSecond)/loss)
			}
			out = append(out, msg+fmt.Sprintf(". While scaled down, %s had %d queue timeouts (504) and %d capacity refusals.",
				bottom, half.RefusedByCause["queue_timeout"], half.RefusedByCause["capacity"]))
		}
	}
	for _, c := range s.Conditions {
		if c.Type == "AgeingHorizonExceedsClientTimeout" && c.Status == "True" {
			out = append(out, fmt.Sprintf("The controller says so itself: condition AgeingHorizonExceedsClientTimeout=True (%s): %s", c.Reason, oneLine(c.Message)))
		}
	}
	// openai-go.
	if o := s.OpenAI; o.Calls > 0 {
		msg := fmt.Sprintf("The openai-go client made %d calls (%d HTTP attempts); %d succeeded, %d after retrying.", o.Calls, o.Attempts, o.Succeeded, o.SucceededAfteRetry)
		if o.RetriesAfterHeader > 0 {
			if o.Honoured == o.RetriesAfterHeader {
				msg += fmt.Sprintf(" All %d retries after a 429/503 waited the Retry-After the dispatcher sent (up to %ds).", o.RetriesAfterHeader, o.MaxRetryAfter)
			} else {
				msg += fmt.Sprintf(" Only %d of %d retries waited the Retry-After the dispatcher sent.", o.Honoured, o.RetriesAfterHeader)
			}
		}
		out = append(out, msg)
	}
	if s.Budget != nil {
		out = append(out, budgetFinding(s.Budget))
	}
	// Every admitted job ended exactly once.
	if j := s.Jobs; s.JobsIdle && j.Admitted > 0 {
		ended := j.Dispatched + j.Abandoned + j.Expired + j.Drained
		msg := fmt.Sprintf("The dispatchers admitted %d requests into their queues: %d were dispatched, %d abandoned by their client, %d expired (504), %d drained", j.Admitted, j.Dispatched, j.Abandoned, j.Expired, j.Drained)
		if ended == j.Admitted {
			msg += "; every one ended exactly once, and nothing was left queued or in flight."
		} else {
			msg += fmt.Sprintf("; **%d admitted requests are unaccounted for**.", int64(j.Admitted)-int64(ended))
		}
		out = append(out, msg)
	}
	// Client against server.
	var diffs []string
	for _, t := range s.Tiers {
		c := t.RefusedByCause["capacity"] + t.RefusedByCause["tenant_limit"] + t.RefusedByCause["rate_limited"]
		sv := int(math.Round(t.ServerRefusedByCause["capacity"] + t.ServerRefusedByCause["tenant_limit"] + t.ServerRefusedByCause["rate_limited"]))
		if c != sv {
			diffs = append(diffs, fmt.Sprintf("%s 429s client %d / server %d", t.Tier, c, sv))
		}
	}
	if len(diffs) == 0 {
		out = append(out, "Client-side and server-side counts of 429 refusals agree for every tier.")
	} else {
		out = append(out, "Client-side and server-side 429 counts differ: "+strings.Join(diffs, "; ")+".")
	}
	return out
}

// tierOrderFinding compares the tiers on the steady streams: a tenant that
// keeps more requests outstanding than its cap waits for its own backlog,
// which says nothing about its tier.
func tierOrderFinding(s *summary) []string {
	var parts, names []string
	var measured []steadyTier
	for _, st := range s.SteadyTiers {
		if st.Dispatched == 0 {
			continue
		}
		measured = append(measured, st)
		parts = append(parts, fmt.Sprintf("%s %.2fs (%s)", st.Tier, st.WaitP95, strings.Join(st.Streams, ", ")))
	}
	if len(measured) < 2 {
		return nil
	}
	ordered := true
	for i := 1; i < len(measured); i++ {
		if measured[i].WaitP95 < measured[i-1].WaitP95 {
			ordered = false
			names = append(names, fmt.Sprintf("%s waited less than %s", measured[i].Tier, measured[i-1].Tier))
		}
	}
	msg := "For the tenants that stay under their own caps, p95 queue wait was " + strings.Join(parts, ", ") + ". "
	if ordered {
		msg += "It follows the tiers: paying tenants did not wait behind free ones."
	} else {
		msg += "**Not in tier order**: " + strings.Join(names, "; ") + "."
	}
	out := []string{msg}
	var capped []string
	for _, st := range s.Streams {
		steady := false
		for _, t := range s.SteadyTiers {
			for _, n := range t.Streams {
				steady = steady || n == st.Name
			}
		}
		if !steady && !st.Budgeted && st.Requests > 0 {
			capped = append(capped, fmt.Sprintf("%s (%s) p95 %.2fs", st.Name, st.Tier, st.WaitP95))
		}
	}
	if len(capped) > 0 {
		out = append(out, "Tenants that keep more requests outstanding than their caps allow wait for their own earlier requests as well: "+strings.Join(capped, ", ")+".")
	}
	return out
}

func secondsD(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
}

func fmtSecondsN(s float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmtSeconds(s)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 600 {
		s = s[:600] + "…"
	}
	return s
}
