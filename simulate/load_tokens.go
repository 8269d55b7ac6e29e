package simulate

import (
	"math"
	"math/rand/v2"

	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// TokenSpec is a distribution of token counts per request, in the form of
// serviceTime with the mean and stddev in tokens.
type TokenSpec struct {
	// Distribution is constant, exponential or lognormal.
	Distribution string `json:"distribution"`
	// Mean is required.
	Mean *float64 `json:"mean,omitempty"`
	// Stddev is required for lognormal and refused otherwise.
	Stddev *float64 `json:"stddev,omitempty"`
}

// MaxTokenCount bounds a token mean, stddev, maxTokens and every drawn
// count: the largest budget the bucket maths keeps exact.
const MaxTokenCount = tokens.MaxLimit

// checkTokens checks a tenant's promptTokens, outputTokens and maxTokens;
// f is the tenant's field path.
func (t *TenantLoad) checkTokens(f string, v *loadErrors) {
	checkTokenSpec(f+".promptTokens", t.PromptTokens, v)
	checkTokenSpec(f+".outputTokens", t.OutputTokens, v)
	if m := t.MaxTokens; m != nil {
		if *m < 1 || *m > MaxTokenCount {
			v.bad(f+".maxTokens", "must be from 1 to %d, got %d", MaxTokenCount, *m)
		}
		if t.OutputTokens == nil {
			v.bad(f+".maxTokens", "is only used with outputTokens")
		}
	}
}

func checkTokenSpec(f string, s *TokenSpec, v *loadErrors) {
	if s == nil {
		return
	}
	switch s.Distribution {
	case DistConstant, DistExponential:
		if s.Stddev != nil {
			v.bad(f+".stddev", "is only used by distribution lognormal")
		}
	case DistLognormal:
		// The negated comparisons refuse NaN too.
		if s.Stddev == nil || !(*s.Stddev > 0) || !(*s.Stddev <= MaxTokenCount) {
			v.bad(f+".stddev", "must be greater than 0 and at most %d for distribution lognormal", MaxTokenCount)
		}
	default:
		v.bad(f+".distribution", "unknown distribution %q (want constant, exponential or lognormal)", s.Distribution)
	}
	switch {
	case s.Mean == nil:
		v.bad(f+".mean", "is required")
	case !(*s.Mean >= 1) || !(*s.Mean <= MaxTokenCount):
		v.bad(f+".mean", "must be from 1 to %d, got %g", MaxTokenCount, *s.Mean)
	}
}

// tokenSampler is a validated TokenSpec.
func tokenSampler(s *TokenSpec) *sampler {
	if s == nil {
		return nil
	}
	var sd float64
	if s.Stddev != nil {
		sd = *s.Stddev
	}
	ts := newSampler(s.Distribution, *s.Mean, sd)
	return &ts
}

// tokens draws one count: the nearest whole number (halves away from
// zero), at least 1 and at most MaxTokenCount.
func (s *sampler) tokens(r *rand.Rand) int64 {
	v := math.Round(s.value(r))
	switch {
	case !(v >= 1): // NaN too
		return 1
	case v >= MaxTokenCount:
		return MaxTokenCount
	}
	return int64(v)
}
