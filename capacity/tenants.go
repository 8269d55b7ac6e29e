package capacity

import (
	"sort"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// liveTenant is a quota in force, as its policy entry needs it.
type liveTenant struct {
	bounds   TenantBounds
	override int32 // spec.maxConcurrency; 0 when unset
	hashes   []string
	// own are spec.limits, pool-wide; nil when unset.
	own *policy.Limits
	// weight is spec.weight when it is not 1 (the default), else 0, so
	// that a tenant of weight 1 pushes the policy of revision 2.
	weight int
}

// tenantBounds reports every quota, sorted by quota name, and returns the
// quotas in force sorted by tenant ID, each with the key hashes it owns.
func tenantBounds(quotas []v1alpha1.TenantQuota, tiers []TierBounds, hashes map[string][]string) ([]TenantBounds, []liveTenant) {
	limits := make(map[string]int32, len(tiers)) // tier name -> tenant limit
	budgets := make(map[string]*policy.Limits, len(tiers))
	for _, tb := range tiers {
		limits[tb.Name] = tb.TenantConcurrencyLimit
		budgets[tb.Name] = tb.TenantLimits
	}
	byName := append([]v1alpha1.TenantQuota(nil), quotas...)
	sort.Slice(byName, func(a, b int) bool { return byName[a].Name < byName[b].Name })
	owner := tenantOwners(byName, limits)

	var out []TenantBounds
	var live []liveTenant
	for _, q := range byName {
		tb := TenantBounds{QuotaName: q.Name, Tenant: q.Spec.Tenant, Tier: q.Spec.TierRef.Name, APIKeys: len(hashes[q.Name])}
		limit, ok := limits[q.Spec.TierRef.Name]
		switch {
		case !ok:
			tb.TierNotFound = true
		case owner[q.Spec.Tenant] != q.Name:
			tb.Duplicate = true
			tb.DuplicateOf = owner[q.Spec.Tenant]
		default:
			var override int32
			tb.EffectiveLimit = limit
			if q.Spec.MaxConcurrency != nil {
				override = *q.Spec.MaxConcurrency
				tb.EffectiveLimit = override
			}
			own := limitsOf(q.Spec.Limits)
			tb.Limits = policy.LimitsOf(&policy.Tenant{Limits: own}, &policy.Tier{TenantLimits: budgets[tb.Tier]})
			tb.LimitsSource = limitsSource(own, tb.Limits)
			tb.Weight = max(1, q.Spec.Weight)
			lt := liveTenant{bounds: tb, override: override, hashes: hashes[q.Name], own: own}
			if tb.Weight != 1 {
				lt.weight = int(tb.Weight)
			}
			live = append(live, lt)
		}
		out = append(out, tb)
	}
	sort.SliceStable(live, func(a, b int) bool { return live[a].bounds.Tenant < live[b].bounds.Tenant })
	shared := claimKeys(live)
	for i := range out {
		out[i].SharedKeys = shared[out[i].QuotaName]
	}
	return out, live
}

// tenantOwners maps each tenant ID to the quota in force for it: the
// oldest (by creation time, then name) of its quotas whose tier exists.
func tenantOwners(quotas []v1alpha1.TenantQuota, tiers map[string]int32) map[string]string {
	byAge := append([]v1alpha1.TenantQuota(nil), quotas...)
	sort.SliceStable(byAge, func(a, b int) bool {
		ta, tb := byAge[a].CreationTimestamp, byAge[b].CreationTimestamp
		if !ta.Equal(&tb) {
			return ta.Before(&tb)
		}
		return byAge[a].Name < byAge[b].Name
	})
	owner := map[string]string{}
	for _, q := range byAge {
		if _, ok := tiers[q.Spec.TierRef.Name]; !ok {
			continue
		}
		if _, taken := owner[q.Spec.Tenant]; !taken {
			owner[q.Spec.Tenant] = q.Name
		}
	}
	return owner
}

// claimKeys gives each key hash to the first tenant of live (sorted by
// tenant ID) that lists it: live's hashes become sorted, without
// duplicates and without keys an earlier tenant claimed. It returns, per
// quota name, how many hashes it lost to an earlier tenant.
func claimKeys(live []liveTenant) map[string]int {
	claimed := map[string]bool{}
	shared := map[string]int{}
	for i := range live {
		var keep []string
		for _, h := range uniqueSorted(live[i].hashes) {
			if claimed[h] {
				shared[live[i].bounds.QuotaName]++
				continue
			}
			claimed[h] = true
			keep = append(keep, h)
		}
		live[i].hashes = keep
	}
	return shared
}

func uniqueSorted(in []string) []string {
	out := append([]string(nil), in...)
	sort.Strings(out)
	n := 0
	for i, v := range out {
		if i == 0 || v != out[n-1] {
			out[n] = v
			n++
		}
	}
	return out[:n]
}
