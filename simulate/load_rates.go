package simulate

import (
	"fmt"
	"math"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// TokenModel is the pool's token rates and fairness weights, given in the
// Load: the ModelPool does not carry them yet (spec.tokens.
// prefillTokensPerSecond and decodeTokensPerSecond, spec.fairness are to
// come), and the simulator reads only what the CRD has.
type TokenModel struct {
	// PrefillTokensPerSecond and DecodeTokensPerSecond are one slot's
	// rates: a request holds its slot for prompt ÷ prefill + output ÷
	// decode seconds.
	PrefillTokensPerSecond float64 `json:"prefillTokensPerSecond"`
	DecodeTokensPerSecond  float64 `json:"decodeTokensPerSecond"`
	// InputWeight and OutputWeight weigh a request's prompt and output
	// tokens in its cost (the policy's fairness weights); omitted, the
	// policy's defaults, 1 and 2.
	InputWeight  int32 `json:"inputWeight,omitempty"`
	OutputWeight int32 `json:"outputWeight,omitempty"`
}

// Bounds of a TokenModel: a rate and a weight large enough for any pool,
// small enough that a cost stays far inside int64.
const (
	MaxTokenRate   = 1e9
	MaxTokenWeight = 1000
)

// checkTokenModel checks spec.tokens and what it needs of the rest of the
// Load: token counts on every tenant and no service-time distribution,
// which the rates replace.
func (s *LoadSpec) checkTokenModel(v *loadErrors) {
	m := s.Tokens
	if m == nil {
		return
	}
	for _, r := range []struct {
		field string
		v     float64
	}{{"prefillTokensPerSecond", m.PrefillTokensPerSecond}, {"decodeTokensPerSecond", m.DecodeTokensPerSecond}} {
		// The negated comparisons refuse NaN too.
		if !(r.v > 0) || !(r.v <= MaxTokenRate) {
			v.bad("tokens."+r.field, "must be greater than 0 and at most %g, got %g", float64(MaxTokenRate), r.v)
		}
	}
	for _, w := range []struct {
		field string
		v     int32
	}{{"inputWeight", m.InputWeight}, {"outputWeight", m.OutputWeight}} {
		if w.v < 0 || w.v > MaxTokenWeight {
			v.bad("tokens."+w.field, "must be from 1 to %d when set, got %d", MaxTokenWeight, w.v)
		}
	}
	if s.ServiceTime != nil {
		v.bad("serviceTime", "is not used with spec.tokens: a request's service time is then its prompt ÷ prefill + output ÷ decode")
	}
	for i, t := range s.Tenants {
		if t.PromptTokens == nil && t.OutputTokens == nil {
			v.bad(fmt.Sprintf("tenants[%d]", i), "needs promptTokens or outputTokens with spec.tokens: its requests would take no time")
		}
	}
}

// serviceTime is how long a request of cost c holds a slot under m: its
// prompt at the prefill rate, then the output it generates at the decode
// rate; at least 1ns, so that a completion comes after its dispatch.
func (m *TokenModel) serviceTime(c requestCost) time.Duration {
	s := float64(c.prompt)/m.PrefillTokensPerSecond + float64(c.output)/m.DecodeTokensPerSecond
	return max(secs(s), 1)
}

// fairness is the policy's Fairness with the model's weights, keeping the
// policy's mode; nil m leaves it as it is.
func (m *TokenModel) fairness(p *policy.Policy) {
	if m == nil || (m.InputWeight == 0 && m.OutputWeight == 0) {
		return
	}
	f := policy.Fairness{}
	if p.Fairness != nil {
		f = *p.Fairness
	}
	if m.InputWeight > 0 {
		f.InputWeight = int(m.InputWeight)
	}
	if m.OutputWeight > 0 {
		f.OutputWeight = int(m.OutputWeight)
	}
	p.Fairness = &f
}

// slotTokenRate is the weighted tokens per second one slot serves at the
// balanced reference, a request of P prompt and P output tokens:
// cost(P, P) ÷ (P ÷ prefill + P ÷ decode), which does not depend on P. It
// is the rate the controller is to derive token bounds from (issue 23);
// the simulator computes it itself until capacity has it.
func slotTokenRate(f policy.Fairness, prefill, decode float64) float64 {
	return float64(f.InputWeight+f.OutputWeight) / (1/prefill + 1/decode)
}

// queueTokenBound is a tier's bound in weighted tokens by Little's law:
// slots × rate × min(W, clientTimeout), floored, at least 1 when there
// are slots; 0 without slots (the request bounds then apply).
func queueTokenBound(slots int, rate float64, w, clientTimeout time.Duration) int64 {
	if slots <= 0 {
		return 0
	}
	weff := w
	if clientTimeout > 0 && clientTimeout < weff {
		weff = clientTimeout
	}
	b := math.Floor(float64(slots) * rate * weff.Seconds())
	switch {
	case !(b >= 1):
		return 1
	case b >= math.MaxInt64/2:
		return math.MaxInt64 / 2
	}
	return int64(b)
}

// tenantTokenLimit is a tenant's share of its tier's token bound,
// max(1, floor(bound × share)), as the request bound's TenantQueueLimit;
// 0 without a bound. The share is a float: the relative nudge keeps a
// product such as 0.29 × 100 from flooring to 28.
func tenantTokenLimit(bound int64, share float64) int64 {
	if bound <= 0 {
		return 0
	}
	return max(1, int64(math.Floor(float64(bound)*share*(1+1e-12))))
}
