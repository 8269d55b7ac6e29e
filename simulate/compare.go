package simulate

import (
	"errors"
	"fmt"
	"strings"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// Scheduler names. tiergate always runs; --compare adds the others.
const (
	SchedTiergate = "tiergate"
	SchedFCFS     = "fcfs"
	SchedStrict   = "strict"
	SchedSeed     = "seed"
	// SchedVTC is tiergate with the pool in fairness mode Tokens and
	// boundBy Requests; SchedVTCTokenBound the same with boundBy Tokens,
	// so that the bounds' effect shows apart from the order's.
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
	SchedVTC:           "tiergate, the pool with fairness.mode Tokens, tokens.boundBy Requests",
	SchedVTCTokenBound: "tiergate, the pool with fairness.mode Tokens, tokens.boundBy Tokens",
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
	// vary, when set, makes the kind a variant of tiergate: it changes a
	// copy of the pool, which then runs through tiergate's code path (the
	// controller's bounds, the real queue), as a user would configure it.
	vary func(spec *v1alpha1.ModelPoolSpec) error
}

var kinds = map[string]*schedKind{
	SchedTiergate: {name: SchedTiergate, build: newTiergate, limits: tiergateLimits},
	SchedFCFS: {
		name:   SchedFCFS,
		build:  newFCFS,
		limits: func(*policy.Policy, *schedEnv) enforced { return enforced{} },
	},
	SchedStrict:        {name: SchedStrict, build: newStrict, limits: strictLimits},
	SchedSeed:          {name: SchedSeed, build: newSeed, limits: seedLimits},
	SchedVTC:           {name: SchedVTC, build: newTiergate, limits: tiergateLimits, vary: tokenFairness},
	SchedVTCTokenBound: {name: SchedVTCTokenBound, build: newTiergate, limits: tiergateLimits, vary: tokenBounds},
}

func newTiergate(env *schedEnv) scheduler { return newQueueScheduler(env.clk) }

func tiergateLimits(p *policy.Policy, _ *schedEnv) enforced { return policyLimits(p) }

// tokenFairness is vtc's pool: spec.fairness.mode Tokens, keeping its
// weights, and spec.tokens.boundBy Requests, so that what differs from
// the pool as configured is the order alone.
func tokenFairness(spec *v1alpha1.ModelPoolSpec) error {
	f := v1alpha1.Fairness{}
	if spec.Fairness != nil {
		f = *spec.Fairness
	}
	f.Mode = v1alpha1.FairnessTokens
	spec.Fairness = &f
	if spec.Tokens != nil {
		t := *spec.Tokens
		t.BoundBy = v1alpha1.BoundByRequests
		spec.Tokens = &t
	}
	return nil
}

// tokenBounds is vtc-tokenbound's pool: vtc's with spec.tokens.boundBy
// Tokens. The controller then bounds each tier at P × r × min(W,
// clientTimeout) weighted tokens, r from the pool's declared rates,
// which it needs: the simulator does not model a measured one.
func tokenBounds(spec *v1alpha1.ModelPoolSpec) error {
	if poolTokenRates(spec) == nil {
		return fmt.Errorf("%w: the pool declares no spec.tokens.prefillTokensPerSecond and decodeTokensPerSecond, from which the token bounds are computed", ErrInvalid)
	}
	if err := tokenFairness(spec); err != nil {
		return err
	}
	spec.Tokens.BoundBy = v1alpha1.BoundByTokens
	return nil
}

// variantInput is in with a copy of its pool changed by vary and
// defaulted again; the other documents are shared, read-only.
func variantInput(in *Input, vary func(*v1alpha1.ModelPoolSpec) error) (*Input, error) {
	c := *in
	c.Pool = in.Pool.DeepCopy()
	if err := vary(&c.Pool.Spec); err != nil {
		return nil, err
	}
	capacity.ApplyDefaults(&c.Pool.Spec)
	return &c, nil
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
