package queue

import (
	"fmt"
	"maps"
	"slices"
)

// fairStep runs one of the operations of Tokens fairness on the queue and
// the model: Settle on any handle, or shared counters for a tier.
func (d *driver) fairStep(op byte, o *ops) {
	switch op {
	case 0:
		j := d.pick(o, func(*mJob) bool { return true })
		if j == nil {
			return
		}
		c := genCost(o)
		d.log = append(d.log, fmt.Sprintf("settle #%d (%s, state %d) %+v", j.seq, j.tenant, j.state, c))
		d.m.settleJob(j, c.Prompt, c.Output)
		j.h.Settle(c.Prompt, c.Output)
	default:
		tier := tierNames[int(o.next())%len(tierNames)]
		counters := map[string]float64{}
		for _, t := range tenantNames {
			if c := o.next(); c%3 == 0 {
				counters[t] = []float64{0, 7, 150, 2500.5}[int(c/3)%4]
			}
		}
		d.log = append(d.log, fmt.Sprintf("shared counters %s %v", tier, counters))
		d.m.applyShared(tier, counters)
		d.q.ApplySharedCounters(tier, counters)
	}
}

// checkCounters compares every counter, of a tenant record or kept idle,
// with the model's: the same charges in the same order give the same
// float64.
func (d *driver) checkCounters() {
	d.t.Helper()
	d.q.mu.Lock()
	var bad string
	for id, ts := range d.q.tenants {
		c := d.m.f.vc[id]
		switch {
		case c == nil:
			bad = fmt.Sprintf("tenant %s has a record, not in the model", id)
		case c.vc != ts.vc || c.shared != ts.shared || c.known != ts.sharedKnown:
			bad = fmt.Sprintf("tenant %s counter %v (shared %v %v), model %v (%v %v)", id, ts.vc, ts.shared, ts.sharedKnown, c.vc, c.shared, c.known)
		}
	}
	if len(d.m.f.vc) != len(d.q.tenants) {
		bad = fmt.Sprintf("model has %d tenant counters, queue %d records", len(d.m.f.vc), len(d.q.tenants))
	}
	for name, tr := range d.q.tiers {
		mt := d.m.tiers[name]
		if mt == nil {
			bad = fmt.Sprintf("tier %s not in the model", name)
			continue
		}
		if tr.hasLast != mt.f.hasLast || tr.lastServed != mt.f.lastServed {
			bad = fmt.Sprintf("tier %s last served %v %v, model %v %v", name, tr.hasLast, tr.lastServed, mt.f.hasLast, mt.f.lastServed)
		}
		got, want := map[string]idleCounter{}, map[string]idleCounter{}
		maps.Copy(got, tr.idle)
		for id, e := range mt.f.idle {
			want[id] = idleCounter{vc: e.vc, shared: e.shared, sharedKnown: e.known}
		}
		if !maps.Equal(got, want) {
			bad = fmt.Sprintf("tier %s idle counters %v, model %v (keys %v)", name, got, want, slices.Sorted(maps.Keys(want)))
		}
	}
	d.q.mu.Unlock()
	if bad != "" {
		d.fail("%s", bad)
	}
}
