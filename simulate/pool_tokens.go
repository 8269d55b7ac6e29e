package simulate

import (
	"fmt"
	"strings"
	"time"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// tokenRates are the pool's declared per-slot rates
// (spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond): with
// them a request holds its slot for its prompt ÷ prefill + output ÷
// decode seconds instead of a drawn service time.
type tokenRates struct{ prefill, decode float64 }

// poolTokenRates reads the pool's rates; nil when it declares none.
func poolTokenRates(spec *v1alpha1.ModelPoolSpec) *tokenRates {
	t := spec.Tokens
	if t == nil || t.PrefillTokensPerSecond < 1 || t.DecodeTokensPerSecond < 1 {
		return nil
	}
	return &tokenRates{prefill: float64(t.PrefillTokensPerSecond), decode: float64(t.DecodeTokensPerSecond)}
}

// serviceTime is how long a request of cost c holds a slot: its prompt at
// the prefill rate, then the output it generates at the decode rate; at
// least 1ns, so that a completion comes after its dispatch.
func (m *tokenRates) serviceTime(c requestCost) time.Duration {
	s := float64(c.prompt)/m.prefill + float64(c.output)/m.decode
	return max(secs(s), 1)
}

// checkLoadTokens refuses a Load that does not fit the pool's rates: a
// service-time distribution, which the rates replace, or a tenant whose
// requests have no tokens and would take no time.
func (in *Input) checkLoadTokens() error {
	if poolTokenRates(&in.Pool.Spec) == nil {
		return nil
	}
	const why = "when the pool declares spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond"
	var errs []string
	if in.Load.Spec.ServiceTime != nil {
		errs = append(errs, "Load spec.serviceTime: is not used "+why+": a request's service time is then its prompt ÷ prefill + output ÷ decode")
	}
	for i, t := range in.Load.Spec.Tenants {
		if t.PromptTokens == nil && t.OutputTokens == nil {
			errs = append(errs, fmt.Sprintf("Load spec.tenants[%d]: needs promptTokens or outputTokens %s: its requests would take no time", i, why))
		}
	}
	return joinInvalid(errs)
}

// tokenWarnings says what the simulator cannot do with the pool's token
// fields: bounds in tokens at a rate only the dispatchers would measure.
func tokenWarnings(spec *v1alpha1.ModelPoolSpec) []string {
	if t := spec.Tokens; t != nil && t.BoundBy == v1alpha1.BoundByTokens && poolTokenRates(spec) == nil {
		return []string{"spec.tokens.boundBy is Tokens without declared token rates: the controller would bound by the rate the dispatchers measure, which the simulator does not model; the tiers are bounded in requests"}
	}
	return nil
}

// checkPoolTokens applies the schema's rules for spec.tokens' rates and
// boundBy and spec.fairness, with the CRD's messages, before the defaults
// (a field given as 0 is refused, one left out is defaulted). spec is the
// document's raw spec, which tells the two apart.
func checkPoolTokens(s *v1alpha1.ModelPoolSpec, spec map[string]any) []string {
	var errs []string
	if t := s.Tokens; t != nil {
		given, _ := spec["tokens"].(map[string]any)
		errs = append(errs, inRange("spec.tokens.prefillTokensPerSecond", given, "prefillTokensPerSecond", t.PrefillTokensPerSecond, v1alpha1.MaxTokensPerSecond)...)
		errs = append(errs, inRange("spec.tokens.decodeTokensPerSecond", given, "decodeTokensPerSecond", t.DecodeTokensPerSecond, v1alpha1.MaxTokensPerSecond)...)
		_, pre := given["prefillTokensPerSecond"]
		_, dec := given["decodeTokensPerSecond"]
		if pre != dec {
			errs = append(errs, "spec.tokens: tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond are set together or not at all")
		}
		switch t.BoundBy {
		case "", v1alpha1.BoundByRequests:
		case v1alpha1.BoundByTokens:
			if !pre && s.ServiceTime.Source != v1alpha1.ServiceTimeMeasured {
				errs = append(errs, "spec.tokens: tokens.boundBy Tokens needs tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond, unless serviceTime.source is Measured")
			}
		default:
			errs = append(errs, fmt.Sprintf("spec.tokens.boundBy: Unsupported value: %q: supported values: \"Requests\", \"Tokens\"", t.BoundBy))
		}
	}
	if f := s.Fairness; f != nil {
		given, _ := spec["fairness"].(map[string]any)
		switch f.Mode {
		case "", v1alpha1.FairnessRequests, v1alpha1.FairnessTokens:
		default:
			errs = append(errs, fmt.Sprintf("spec.fairness.mode: Unsupported value: %q: supported values: \"Requests\", \"Tokens\"", f.Mode))
		}
		errs = append(errs, inRange("spec.fairness.inputWeight", given, "inputWeight", f.InputWeight, v1alpha1.MaxTokenWeight)...)
		errs = append(errs, inRange("spec.fairness.outputWeight", given, "outputWeight", f.OutputWeight, v1alpha1.MaxTokenWeight)...)
	}
	return errs
}

// inRange refuses v outside [1, most] when given names key, and a
// negative or too large v in any case.
func inRange(field string, given map[string]any, key string, v, most int32) []string {
	_, set := given[key]
	if (set && v < 1) || v < 0 || v > most {
		return []string{fmt.Sprintf("%s: must be from 1 to %d, got %d", field, most, v)}
	}
	return nil
}

// joinInvalid is one ErrInvalid naming every problem; nil without any.
func joinInvalid(errs []string) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(errs, "; "))
}
