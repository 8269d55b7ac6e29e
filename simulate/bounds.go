package simulate

import (
	"fmt"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/capacity"
)

// policyState is the policy the dispatchers run with.
type policyState struct {
	first   capacity.Bounds // at the Load's replicas
	version int64
	// slots is the pool's, over every dispatcher.
	slots int
	// stated is what the run's scheduler enforces pool-wide at the Load's
	// replicas: the figures' bound and limits.
	stated enforced
	// held is the pool-wide bounds while the pool is at zero replicas and
	// holds requests for its first replica (spec.coldStart); nil otherwise.
	held *capacity.Bounds
	// fair and weight are the cost weights and the tenants' weights of the
	// policy in force, which jainTokens and tokenShare measure by.
	fair   policy.Fairness
	weight map[string]int
}

// noteWeights keeps the cost weights and tenant weights of the pool-wide
// policy p.
func (e *engine) noteWeights(p *policy.Policy) {
	e.fair = p.FairnessOf()
	e.weight = map[string]int{}
	for i := range p.Tenants {
		e.weight[p.Tenants[i].ID] = p.Tenants[i].WeightOf()
	}
}

// weightOf is tenant's fairness weight: 1 for one the policy does not
// list (the default tier's).
func (e *engine) weightOf(tenant string) int {
	if w := e.weight[tenant]; w > 0 {
		return w
	}
	return 1
}

// computeBounds runs the controller's computation for the given number of
// dispatchers.
func (e *engine) computeBounds(replicas int32, dispatchers int) (capacity.Bounds, error) {
	backends := make([]policy.Backend, replicas)
	port := e.in.Pool.Spec.Backend.Port
	if port == 0 {
		port = 8000
	}
	for i := range backends {
		backends[i] = policy.Backend{Address: fmt.Sprintf("10.%d.%d.%d:%d", (i>>16)&255, (i>>8)&255, i&255, port), Scheme: e.in.Pool.Spec.Backend.Scheme}
	}
	b, err := capacity.ComputeBounds(capacity.BoundsInput{
		Pool:          e.in.Pool,
		ReadyReplicas: replicas,
		Tiers:         e.in.Tiers,
		Quotas:        e.in.Quotas,
		Dispatchers:   dispatchers,
		Backends:      backends,
	})
	if err != nil {
		return b, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(b.Tiers) == 0 {
		return b, fmt.Errorf("%w: pool %s/%s has no ServiceTier", ErrInvalid, e.in.Pool.Namespace, e.in.Pool.Name)
	}
	return b, nil
}

// changeReplicas is an autoscaler's move: the bounds are recomputed at the
// new replica count and pushed.
func (e *engine) changeReplicas(i int32) {
	r := e.load.ReplicaChanges[i].Replicas
	b, err := e.computeBounds(r, len(e.disp))
	if err != nil {
		e.fail(err)
		return
	}
	if err := e.applyPolicy(b, r); err != nil {
		e.fail(err)
		return
	}
	e.settleAll()
}

// applyPolicy pushes each dispatcher its policy of b, as the controller
// would, and notes what the scheduler enforces under it.
func (e *engine) applyPolicy(b capacity.Bounds, replicas int32) error {
	e.version++
	e.slots = 0
	for d, disp := range e.disp {
		pol := b.PolicyFor(d)
		pol.Version = e.version
		if err := pol.Validate(); err != nil {
			return fmt.Errorf("%w: the computed policy is invalid: %w", ErrInternal, err)
		}
		disp.sched.UpdatePolicy(&pol)
		disp.slots = pol.Slots
		e.slots += pol.Slots
		e.setLimits(d, e.kind.limits(&pol, e.env))
	}
	whole := b
	if len(e.disp) > 1 {
		var err error
		if whole, err = e.computeBounds(replicas, 1); err != nil {
			return err
		}
	}
	wp := whole.PolicyFor(0)
	stated := e.kind.limits(&wp, e.env)
	e.noteWeights(&wp)
	e.held = nil
	if whole.Pool.ColdStart > 0 {
		e.held = &whole
		e.noteHeldBounds(whole)
	}
	if e.version == 1 {
		e.stated = stated
	} else {
		e.recordPolicyChange(replicas, stated, whole)
	}
	return nil
}

// setLimits gives every tenant its cap and its part of its budgets on
// dispatcher d. A tenant already at its new cap counts as having reached
// it.
func (e *engine) setLimits(d int, lim enforced) {
	for _, ts := range e.tenants {
		ta := &ts.at[d]
		ta.budget = lim.budgetOf(ts.name, ts.tier.name)
		ta.limit = lim.capOf(ts.name, ts.tier.name)
		if ta.atCap() {
			ta.capHits++
		}
	}
}

// recordPolicyChange notes the scheduler's pool-wide bounds under the new
// policy and what the controller would state for it: the tiers' maxWait
// (status.maxWait), the cold start while held, and the tiers refused at
// zero because they cannot wait it out.
func (e *engine) recordPolicyChange(replicas int32, stated enforced, whole capacity.Bounds) {
	pc := PolicyChange{AtSeconds: round6(e.now.Seconds()), Replicas: replicas, Slots: e.slots, Bounds: map[string]int{},
		ColdStartSeconds: round6(whole.Pool.ColdStart.Seconds())}
	for _, name := range e.res.order {
		pc.Bounds[name] = stated.tiers[name].bound
	}
	for _, tb := range whole.Tiers {
		switch {
		case whole.Pool.ColdStart > 0 && tb.QueueBound == 0:
			pc.RefusedAtZero = append(pc.RefusedAtZero, tb.Name)
		case !tb.Unbounded:
			if pc.MaxWait == nil {
				pc.MaxWait = map[string]float64{}
			}
			pc.MaxWait[tb.Name] = round6(tb.MaxWait.Seconds())
		}
	}
	e.res.PolicyChanges = append(e.res.PolicyChanges, pc)
}

func maxWaitOf(b capacity.Bounds, tier string) time.Duration {
	for _, t := range b.Tiers {
		if t.Name == tier {
			return t.MaxWait
		}
	}
	return 0
}
