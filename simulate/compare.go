package simulate

import (
	"errors"
	"fmt"
	"strings"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Scheduler names. tiergate always runs; --compare adds the others.
const (
	SchedTiergate = "tiergate"
	SchedFCFS     = "fcfs"
	SchedStrict   = "strict"
	SchedSeed     = "seed"
	// SchedVTC is tiergate's queue with Tokens fairness and its request
	// bounds; SchedVTCTokenBound the same bounded in weighted tokens, so
	// that the bounds' effect shows apart from the order's.
	SchedVTC           = "vtc"
	SchedVTCTokenBound = "vtc-tokenbound"
)

// Baselines are the other schedulers --compare accepts.
var Baselines = []string{SchedFCFS, SchedStrict, SchedSeed}

// Variants are tiergate's own queue under other settings, which --compare
// also accepts.
var Variants = []string{SchedVTC, SchedVTCTokenBound}

// Described says what each scheduler of a comparison is, for the tables.
var Described = map[string]string{
	SchedTiergate:      "tiergate's queue as configured",
	SchedFCFS:          "one FIFO over all tiers",
	SchedStrict:        "strict priority between tiers, FIFO within",
	SchedSeed:          "the seed's scheduler",
	SchedVTC:           "tiergate's queue, Tokens fairness, bounded in requests",
	SchedVTCTokenBound: "tiergate's queue, Tokens fairness, bounded in weighted tokens",
}

// ErrScheduler reports a bad --compare list.
var ErrScheduler = errors.New("scheduler")

// schedKind is one scheduler a run can use: how to build one per
// dispatcher, and what it enforces under a policy (for the figures and
// the invariant checks).
type schedKind struct {
	name   string
	build  func(env *schedEnv) scheduler
	limits func(p *policy.Policy, env *schedEnv) enforced
	// shape, when set, changes every policy the run pushes.
	shape func(p *policy.Policy, env *schedEnv)
	// needsTokens: the kind needs the Load's spec.tokens.
	needsTokens bool
}

var kinds = map[string]*schedKind{
	SchedTiergate: {
		name:   SchedTiergate,
		build:  func(env *schedEnv) scheduler { return newQueueScheduler(env.clk) },
		limits: func(p *policy.Policy, _ *schedEnv) enforced { return policyLimits(p) },
	},
	SchedFCFS: {
		name:   SchedFCFS,
		build:  newFCFS,
		limits: func(*policy.Policy, *schedEnv) enforced { return enforced{} },
	},
	SchedStrict: {name: SchedStrict, build: newStrict, limits: strictLimits},
	SchedSeed:   {name: SchedSeed, build: newSeed, limits: seedLimits},
	SchedVTC: {
		name:   SchedVTC,
		build:  func(env *schedEnv) scheduler { return newQueueScheduler(env.clk) },
		limits: func(p *policy.Policy, _ *schedEnv) enforced { return policyLimits(p) },
		shape:  func(p *policy.Policy, _ *schedEnv) { tokensFairness(p) },
	},
	SchedVTCTokenBound: {
		name:   SchedVTCTokenBound,
		build:  func(env *schedEnv) scheduler { return newQueueScheduler(env.clk) },
		limits: func(p *policy.Policy, _ *schedEnv) enforced { return policyLimits(p) },
		shape: func(p *policy.Policy, env *schedEnv) {
			tokensFairness(p)
			tokenBounds(p, env)
		},
		needsTokens: true,
	},
}

// tokensFairness puts p in Tokens fairness, with its weights.
func tokensFairness(p *policy.Policy) {
	f := p.FairnessOf()
	f.Mode = policy.FairnessTokens
	p.Fairness = &f
}

// tokenBounds bounds p's tiers in weighted tokens, as the controller is
// to with spec.tokens.boundBy Tokens: each tier at slots × r × min(W,
// clientTimeout), r the slot's rate at the balanced reference
// (slotTokenRate), each tenant at its tier's share of that, and the
// token drain rate for Retry-After at slots × r. A policy without slots
// keeps its request bounds.
func tokenBounds(p *policy.Policy, env *schedEnv) {
	m := env.tokens
	rate := slotTokenRate(p.FairnessOf(), m.PrefillTokensPerSecond, m.DecodeTokensPerSecond)
	if p.Slots <= 0 {
		return
	}
	p.TokenServiceRate = float64(p.Slots) * rate
	for i := range p.Tiers {
		t := &p.Tiers[i]
		t.QueueTokenBound = queueTokenBound(p.Slots, rate, secs(t.TolerableWaitSeconds), secs(p.ClientTimeoutSeconds))
		t.TenantQueueTokenLimit = tenantTokenLimit(t.QueueTokenBound, env.tiers[env.index[t.Name]].share)
	}
}

// ParseCompare reads a --compare value: baseline names separated by
// commas.
func ParseCompare(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		return nil, fmt.Errorf("no %w named (want %s)", ErrScheduler, wantBaselines())
	}
	names := strings.Split(v, ",")
	for i := range names {
		names[i] = strings.TrimSpace(names[i])
	}
	return names, checkCompare(names)
}

// checkCompare refuses unknown and repeated names.
func checkCompare(names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		switch {
		case n == SchedTiergate:
			return fmt.Errorf("%w %q always runs; name the ones to run next to it (%s)", ErrScheduler, n, wantBaselines())
		case kinds[n] == nil:
			return fmt.Errorf("%w %q is unknown (want %s)", ErrScheduler, n, wantBaselines())
		case seen[n]:
			return fmt.Errorf("%w %q is named twice", ErrScheduler, n)
		}
		seen[n] = true
	}
	return nil
}

func wantBaselines() string {
	all := append(append([]string{}, Baselines...), Variants...)
	return strings.Join(all[:len(all)-1], ", ") + " or " + all[len(all)-1]
}
