package capacity

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// validateInput refuses what the schema refuses and the arithmetic cannot
// take, naming every problem at once.
func validateInput(in BoundsInput) error {
	if in.Pool == nil {
		return fmt.Errorf("%w: no pool", ErrInvalidInput)
	}
	errs := validateSpec(&in.Pool.Spec)
	if in.ReadyReplicas < 0 {
		errs = append(errs, fmt.Sprintf("readyReplicas: %d must not be negative", in.ReadyReplicas))
	}
	if in.Dispatchers < 0 {
		errs = append(errs, fmt.Sprintf("dispatchers: %d must not be negative", in.Dispatchers))
	}
	if in.Excluded != nil && len(in.Excluded) != in.Dispatchers {
		errs = append(errs, fmt.Sprintf("excluded: %d entries for %d dispatchers", len(in.Excluded), in.Dispatchers))
	}
	errs = append(errs, validateTiers(in.Tiers)...)
	for _, q := range in.Quotas {
		if q.Spec.MaxConcurrency != nil && *q.Spec.MaxConcurrency < 1 {
			errs = append(errs, fmt.Sprintf("quota %q: spec.maxConcurrency %d must be at least 1", q.Name, *q.Spec.MaxConcurrency))
		}
		errs = append(errs, validateLimits(fmt.Sprintf("quota %q: spec.limits", q.Name), q.Spec.Limits)...)
		if q.Spec.Weight < 0 || q.Spec.Weight > v1alpha1.MaxTokenWeight {
			errs = append(errs, fmt.Sprintf("quota %q: spec.weight %d must be between 1 and %d", q.Name, q.Spec.Weight, v1alpha1.MaxTokenWeight))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidInput, strings.Join(errs, "; "))
	}
	return nil
}

func validateSpec(spec *v1alpha1.ModelPoolSpec) []string {
	var errs []string
	if spec.ConcurrencyPerReplica < 1 {
		errs = append(errs, fmt.Sprintf("spec.concurrencyPerReplica: %d must be at least 1", spec.ConcurrencyPerReplica))
	}
	if spec.ServiceTime.Mean.Duration <= 0 {
		errs = append(errs, fmt.Sprintf("spec.serviceTime.mean: %s must be greater than 0", spec.ServiceTime.Mean.Duration))
	}
	if spec.ClientTimeout != nil && spec.ClientTimeout.Duration < 0 {
		errs = append(errs, fmt.Sprintf("spec.clientTimeout: %s must not be negative", spec.ClientTimeout.Duration))
	}
	if r := spec.Ageing.Rate; r != nil && r.Duration <= 0 {
		errs = append(errs, fmt.Sprintf("spec.ageing.rate: %s must be greater than 0", r.Duration))
	}
	if b := spec.Ageing.StarvationBound; b != nil && b.Duration <= 0 {
		errs = append(errs, fmt.Sprintf("spec.ageing.starvationBound: %s must be greater than 0", b.Duration))
	}
	if spec.Ageing.Rate != nil && spec.Ageing.StarvationBound != nil {
		errs = append(errs, "spec.ageing: set exactly one of rate and starvationBound")
	}
	if spec.ColdStart != nil && spec.ColdStart.Duration <= 0 {
		errs = append(errs, fmt.Sprintf("spec.coldStart: %s must be greater than 0", spec.ColdStart.Duration))
	}
	if spec.Tokens != nil && spec.Tokens.DefaultMaxTokens < 0 {
		errs = append(errs, fmt.Sprintf("spec.tokens.defaultMaxTokens: %d must be at least 1", spec.Tokens.DefaultMaxTokens))
	}
	errs = append(errs, validateTokenBounds(spec.Tokens)...)
	errs = append(errs, validateFairness(spec.Fairness)...)
	return append(errs, validateAutoscaling(spec.Autoscaling)...)
}

func validateAutoscaling(a *v1alpha1.Autoscaling) []string {
	if a == nil {
		return nil
	}
	var errs []string
	if a.MinReplicas < 0 {
		errs = append(errs, fmt.Sprintf("spec.autoscaling.minReplicas: %d must not be negative", a.MinReplicas))
	}
	if a.MaxReplicas < 1 {
		errs = append(errs, fmt.Sprintf("spec.autoscaling.maxReplicas: %d must be at least 1", a.MaxReplicas))
	}
	if a.MinReplicas > a.MaxReplicas {
		errs = append(errs, fmt.Sprintf("spec.autoscaling.minReplicas: %d must not exceed maxReplicas %d", a.MinReplicas, a.MaxReplicas))
	}
	if u := a.TargetUtilization; u != nil {
		if r := shareRat(*u); r.Sign() <= 0 || r.Cmp(big.NewRat(1, 1)) > 0 {
			errs = append(errs, fmt.Sprintf("spec.autoscaling.targetUtilization: %s must be greater than 0 and at most 1", u.String()))
		}
	}
	return errs
}

func validateTiers(tiers []v1alpha1.ServiceTier) []string {
	var errs []string
	seen := map[string]bool{}
	for _, t := range tiers {
		if seen[t.Name] {
			errs = append(errs, fmt.Sprintf("tier %q: listed twice", t.Name))
		}
		seen[t.Name] = true
		if t.Spec.BasePriority < 0 {
			errs = append(errs, fmt.Sprintf("tier %q: spec.basePriority %d must not be negative", t.Name, t.Spec.BasePriority))
		}
		if t.Spec.TolerableWait.Duration <= 0 {
			errs = append(errs, fmt.Sprintf("tier %q: spec.tolerableWait %s must be greater than 0", t.Name, t.Spec.TolerableWait.Duration))
		}
		if r := shareRat(t.Spec.TenantShare); r.Sign() <= 0 || r.Cmp(big.NewRat(1, 1)) > 0 {
			errs = append(errs, fmt.Sprintf("tier %q: spec.tenantShare %s must be greater than 0 and at most 1", t.Name, t.Spec.TenantShare.String()))
		}
		errs = append(errs, validateLimits(fmt.Sprintf("tier %q: spec.tenantLimits", t.Name), t.Spec.TenantLimits)...)
	}
	return errs
}

// validateTokenBounds refuses token rates the schema refuses (0 is
// unset); the rule that boundBy Tokens needs them is not repeated: without
// a rate the queues are bounded by requests.
func validateTokenBounds(t *v1alpha1.Tokens) []string {
	if t == nil {
		return nil
	}
	var errs []string
	errs = optionalInRange(errs, "spec.tokens.prefillTokensPerSecond", t.PrefillTokensPerSecond, v1alpha1.MaxTokensPerSecond)
	errs = optionalInRange(errs, "spec.tokens.decodeTokensPerSecond", t.DecodeTokensPerSecond, v1alpha1.MaxTokensPerSecond)
	switch t.BoundBy {
	case "", v1alpha1.BoundByRequests, v1alpha1.BoundByTokens:
	default:
		errs = append(errs, fmt.Sprintf("spec.tokens.boundBy: %q must be Requests or Tokens", t.BoundBy))
	}
	return errs
}

// validateFairness refuses weights outside 1..MaxTokenWeight (0 is unset)
// and an unknown mode.
func validateFairness(f *v1alpha1.Fairness) []string {
	if f == nil {
		return nil
	}
	var errs []string
	errs = optionalInRange(errs, "spec.fairness.inputWeight", f.InputWeight, v1alpha1.MaxTokenWeight)
	errs = optionalInRange(errs, "spec.fairness.outputWeight", f.OutputWeight, v1alpha1.MaxTokenWeight)
	switch f.Mode {
	case "", v1alpha1.FairnessRequests, v1alpha1.FairnessTokens:
	default:
		errs = append(errs, fmt.Sprintf("spec.fairness.mode: %q must be Requests or Tokens", f.Mode))
	}
	return errs
}

// optionalInRange appends the refusal of v, an optional field at path
// (0 is unset), when it is outside 1..limit.
func optionalInRange(errs []string, path string, v, limit int32) []string {
	if v < 0 || v > limit {
		errs = append(errs, fmt.Sprintf("%s: %d must be between 1 and %d", path, v, limit))
	}
	return errs
}
