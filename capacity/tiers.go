package capacity

import (
	"math/big"
	"sort"
	"time"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// sortedTiers orders tiers by base priority, then name: the first has the
// lowest base, so it is served first.
func sortedTiers(in []v1alpha1.ServiceTier) []v1alpha1.ServiceTier {
	out := append([]v1alpha1.ServiceTier(nil), in...)
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Spec.BasePriority != out[b].Spec.BasePriority {
			return out[a].Spec.BasePriority < out[b].Spec.BasePriority
		}
		return out[a].Name < out[b].Name
	})
	return out
}

// tierBounds computes each tier's queue bound L = max(1, floor(P × Weff /
// S)) with Weff = min(W, clientTimeout), and its tenant limits from P and L
// and the tier's share. While held, P is C and L = max(0, floor(C × (Weff −
// coldStart) / S)): a tier that cannot wait out the cold start gets 0. At
// P = 0 without a cold start nothing is served or held, so L is 0.
// MaxWait is left to stateMaxWaits.
func tierBounds(r rates, sorted []v1alpha1.ServiceTier, clientTimeout time.Duration) []TierBounds {
	var out []TierBounds
	for _, t := range sorted {
		w := t.Spec.TolerableWait.Duration
		weff := w
		if clientTimeout > 0 && clientTimeout < weff {
			weff = clientTimeout
		}
		l := r.servedWithin(weff)
		if !r.held() && r.boundsFor > 0 {
			l = atLeastOne(l)
		}
		share := shareRat(t.Spec.TenantShare)
		out = append(out, TierBounds{
			Name:                   t.Name,
			BasePriority:           t.Spec.BasePriority,
			TolerableWait:          w,
			QueueBound:             int32(l),
			TenantConcurrencyLimit: int32(atLeastOne(floorShare(r.boundsFor, share))),
			TenantQueueLimit:       int32(atLeastOne(floorShare(l, share))),
			TenantLimits:           limitsOf(t.Spec.TenantLimits),
		})
	}
	return out
}

// floorShare is floor(n × share), capped at the int32 range.
func floorShare(n int64, share *big.Rat) int64 {
	return clampInt32(floorRat(new(big.Rat).Mul(new(big.Rat).SetInt64(n), share)))
}

// stateMaxWaits sets each tier's MaxWait = coldStart + ageing × (base −
// base_min) + ΣL × S / P + S and its Guarantee; coldStart is 0 unless
// held, and P is C while held. pool.TotalQueueBound must be set. With
// nothing to serve (P = 0 and no cold start) no wait can be promised, nor
// while held to a tier with bound 0, which is refused.
func stateMaxWaits(sorted []TierBounds, pool PoolBounds, r rates) {
	if len(sorted) == 0 {
		return
	}
	minBase, top := sorted[0].BasePriority, sorted[0].Name
	for i := range sorted {
		tb := &sorted[i]
		behind := mulDuration(pool.AgeingRate, int64(tb.BasePriority-minBase))
		var drain time.Duration
		if r.boundsFor == 0 || (r.held() && tb.QueueBound == 0) {
			tb.Unbounded = true
		} else {
			drain = r.drainTime(pool.TotalQueueBound)
			wait := addDurations(behind, r.coldStart, drain, r.serviceTime)
			tb.MaxWait = saturate(wait)
			tb.MaxWaitExceedsClientTimeout = pool.ClientTimeout > 0 && longer(wait, pool.ClientTimeout)
		}
		tb.Guarantee = guarantee(*tb, pool, top, saturate(behind), drain, tb.BasePriority == minBase)
	}
}

func hasTier(tiers []TierBounds, name string) bool {
	for _, tb := range tiers {
		if tb.Name == name {
			return true
		}
	}
	return false
}
