package simulate

import "time"

// tierState is one tier's queue length and figures.
type tierState struct {
	name string
	// wait is the tier's tolerableWait, the SLO of sloAttainment.
	wait   time.Duration
	queued int
	// queuedTokens is the reserved cost of the queued requests.
	queuedTokens int64
	// sloMet counts requests offered in the window and served within wait.
	sloMet int64
	// area is ∫ queued dt over the window, request-seconds.
	area       float64
	sojournSum float64
	sojournN   int64
	// underMax is the longest wait of a request under its tenant's limits.
	underMax time.Duration
	// heldMax is the longest wait of a request held at zero, heldStated
	// the tier's maxWait at zero (0: refused there); zero.go.
	heldMax, heldStated time.Duration
	res                 *TierResult
	ser                 *series
}

// count adds to a figure of the tenant and of its tier, if now is inside
// the measured window.
func (e *engine) count(ts *tenantState, add func(*Figures)) {
	if e.inWindow() {
		add(&ts.res.Figures)
		add(&ts.tier.res.Figures)
	}
}

// enqueued counts an admission. r now waits in the queue; it is about the
// guarantee if its tenant is under its concurrency limit now and stays so
// until r is dispatched.
func (e *engine) enqueued(r *request) {
	ts, tier := r.ten, r.ten.tier
	e.count(ts, func(f *Figures) { f.Admitted++ })
	e.admitted++
	r.state, r.admitAt = stQueued, e.now
	e.admittedAtZero(r)
	ta := &ts.at[r.disp]
	r.underLimits, r.capMark = !ta.atCap(), ta.capHits
	tier.queued++
	tier.res.MaxQueued = max(tier.res.MaxQueued, tier.queued)
	r.queuedCost = e.fair.Cost(r.cost.prompt, r.cost.maxOut)
	tier.queuedTokens += r.queuedCost
	tier.res.MaxQueuedTokens = max(tier.res.MaxQueuedTokens, tier.queuedTokens)
}

// leaveQueue counts r's time in the queue, however it left.
func (e *engine) leaveQueue(r *request) {
	tier := r.ten.tier
	tier.queued--
	tier.queuedTokens -= r.queuedCost
	if e.inWindow() {
		tier.sojournSum += (e.now - r.admitAt).Seconds()
		tier.sojournN++
	}
}

// recordWait counts the wait of a dispatched request.
func (e *engine) recordWait(r *request, waited time.Duration) {
	ts, tier := r.ten, r.ten.tier
	if e.inWindow() {
		w := waited.Seconds()
		ts.res.waits = append(ts.res.waits, w)
		tier.res.waits = append(tier.res.waits, w)
		if r.heldAtZero {
			e.heldDispatched(r, waited)
		} else if r.underLimits && ts.at[r.disp].capHits == r.capMark {
			tier.res.UnderLimits.Count++
			tier.underMax = max(tier.underMax, waited)
		}
	}
	tier.ser.add(e.now.Seconds(), waited.Seconds())
}

// served counts a generation whose client received the answer, and
// whether it was offered in the window and started within its tier's
// tolerableWait of its first attempt.
func (e *engine) served(r *request) {
	e.count(r.ten, func(f *Figures) {
		f.Served++
		f.TokensServed.Prompt += r.cost.prompt
		f.TokensServed.Completion += r.cost.output
	})
	if tier := r.ten.tier; r.arrived >= e.warmup && r.dispatchAt-r.arrived <= tier.wait {
		tier.sloMet++
	}
}

// waste counts the slot-seconds of [from, to] inside the window as spent
// for a client that was gone, or left before its answer came.
func (e *engine) waste(from, to time.Duration) {
	if d := min(to, e.duration) - max(from, e.warmup); d > 0 {
		e.wasted += d.Seconds()
	}
}

// integrate adds the part of [lastT, t] inside the window to the
// time-weighted figures.
func (e *engine) integrate(t time.Duration) {
	from := max(e.lastT, e.warmup)
	if t > from {
		dt := (t - from).Seconds()
		e.inflightArea += float64(e.inflight) * dt
		// After a scale-down, slots still busy count as capacity until
		// they free.
		for _, d := range e.disp {
			e.slotsArea += float64(max(d.slots, d.inflight)) * dt
		}
		for _, ts := range e.tierList {
			ts.area += float64(ts.queued) * dt
		}
	}
	e.lastT = t
}

// finish turns the counts into the Result.
func (e *engine) finish() *Result {
	res := e.res
	window := (e.duration - e.warmup).Seconds()
	if e.slotsArea > 0 {
		res.Utilisation = round6(e.inflightArea / e.slotsArea)
	}
	var served int64
	for _, tr := range res.Tiers {
		served += tr.Served
	}
	share := func(n int64) float64 {
		if served == 0 {
			return 0
		}
		return round6(float64(n) / float64(served))
	}
	res.Goodput = round6(float64(served) / window)
	res.busySlotSeconds = e.inflightArea
	res.WastedServiceSeconds = round6(e.wasted)
	res.MeasuredTokenRate = e.measuredTokenRate()
	for _, ts := range e.tiers {
		tr := ts.res
		tr.finish(window)
		tr.ThroughputShare = share(tr.Served)
		if tr.Offered > 0 {
			tr.SLOAttainment = round6(float64(ts.sloMet) / float64(tr.Offered))
		}
		tr.UnderLimits.MaxWait = round6(ts.underMax.Seconds())
		tr.UnderLimits.WithinMaxWait = ts.underMax <= maxWaitOf(e.first, ts.name)
		ts.finishHeld()
		tr.Queue.MeanLength = round6(ts.area / window)
		tr.Queue.AdmissionRate = round6(float64(tr.Admitted) / window)
		if ts.sojournN > 0 {
			tr.Queue.MeanTimeInQueue = round6(ts.sojournSum / float64(ts.sojournN))
		}
	}
	thru := map[string][]float64{}
	for _, ts := range e.tenants {
		ts.res.finish(window)
		ts.res.ThroughputShare = share(ts.res.Served)
		thru[ts.tier.name] = append(thru[ts.tier.name], ts.res.Throughput)
	}
	for name, tr := range res.Tiers {
		tr.Jain = round6(jain(thru[name]))
	}
	e.finishTokens()
	if e.kind.name == SchedTiergate {
		res.Warnings = append(res.Warnings, e.warnings()...)
	} else {
		// The configuration's warnings are tiergate's result's.
		res.Warnings = []string{}
	}
	return res
}

// jain is Jain's fairness index (Σx)² / (n Σx²): 1 when all are equal, 1/n
// when one has everything; 0 when all are 0 (undefined) or there are none.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// finishTokens sets each tier's jainTokens, Jain's index over its Load
// tenants' weighted tokens served ÷ their weights, and each tenant's
// tokenShare, its part of its tier's weighted tokens served. The weights
// are those of the policy in force at the end.
func (e *engine) finishTokens() {
	norm := map[string][]float64{}
	total := map[string]int64{}
	for _, ts := range e.tenants {
		c := e.weighted(ts.res.TokensServed)
		norm[ts.tier.name] = append(norm[ts.tier.name], float64(c)/float64(e.weightOf(ts.name)))
		total[ts.tier.name] += c
	}
	for name, tr := range e.res.Tiers {
		tr.JainTokens = round6(jain(norm[name]))
	}
	for _, ts := range e.tenants {
		if t := total[ts.tier.name]; t > 0 {
			ts.res.TokenShare = round6(float64(e.weighted(ts.res.TokensServed)) / float64(t))
		}
	}
}

// weighted is c's cost under the policy's weights: prompt × inputWeight +
// completion × outputWeight.
func (e *engine) weighted(c TokenCounts) int64 { return e.fair.Cost(c.Prompt, c.Completion) }

// measuredTokenRate combines the dispatchers' measured tokens per
// slot-second, weighted by the answers each served.
func (e *engine) measuredTokenRate() float64 {
	var sum float64
	var n uint64
	for _, d := range e.disp {
		if rate, served := d.sched.Measured(); rate > 0 && served > 0 {
			sum += rate * float64(served)
			n += served
		}
	}
	if n == 0 {
		return 0
	}
	return round6(sum / float64(n))
}
