package simulate

import (
	"fmt"
	"time"

	"github.com/tiergate/tiergate/capacity"
	"github.com/tiergate/tiergate/dispatcher/policy"
)

// policyState is the policy the scheduler runs with.
type policyState struct {
	first   capacity.Bounds // at the Load's replicas
	version int64
	slots   int
}

// computeBounds runs the controller's computation for one dispatcher in
// Local mode.
func (e *engine) computeBounds(replicas int32) (capacity.Bounds, error) {
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
		Dispatchers:   1,
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
	b, err := e.computeBounds(r)
	if err != nil {
		e.fail(err)
		return
	}
	if err := e.applyPolicy(b, r); err != nil {
		e.fail(err)
		return
	}
	e.settle()
}

// applyPolicy pushes b's policy to the scheduler, as the controller would.
func (e *engine) applyPolicy(b capacity.Bounds, replicas int32) error {
	pol := b.PolicyFor(0)
	e.version++
	pol.Version = e.version
	if err := pol.Validate(); err != nil {
		return fmt.Errorf("%w: the computed policy is invalid: %w", ErrInternal, err)
	}
	e.sched.UpdatePolicy(&pol)
	e.slots = pol.Slots
	e.setLimits(&pol)
	if e.version > 1 {
		e.recordPolicyChange(&pol, replicas)
	}
	return nil
}

// setLimits gives every tenant the limits of pol. A tenant already at its
// new limit counts as having reached it.
func (e *engine) setLimits(pol *policy.Policy) {
	tiers := map[string]policy.Tier{}
	for _, t := range pol.Tiers {
		tiers[t.Name] = t
	}
	override := map[string]int{}
	for _, t := range pol.Tenants {
		override[t.ID] = t.MaxConcurrency
	}
	for _, ts := range e.tenants {
		t := tiers[ts.tier.name]
		ts.limit = t.TenantConcurrencyLimit
		if o := override[ts.name]; o > 0 {
			ts.limit = o
		}
		ts.queueLimit = t.TenantQueueLimit
		if ts.inflight >= ts.limit {
			ts.capHits++
		}
	}
}

func (e *engine) recordPolicyChange(pol *policy.Policy, replicas int32) {
	pc := PolicyChange{AtSeconds: round6(e.now.Seconds()), Replicas: replicas, Slots: pol.Slots, Bounds: map[string]int{}}
	for _, t := range pol.Tiers {
		pc.Bounds[t.Name] = t.QueueBound
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
