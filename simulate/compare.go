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
)

// Baselines are the schedulers --compare accepts.
var Baselines = []string{SchedFCFS, SchedStrict, SchedSeed}

// ErrScheduler reports a bad --compare list.
var ErrScheduler = errors.New("scheduler")

// schedKind is one scheduler a run can use: how to build one per
// dispatcher, and what it enforces under a policy (for the figures and
// the invariant checks).
type schedKind struct {
	name   string
	build  func(env *schedEnv) scheduler
	limits func(p *policy.Policy, env *schedEnv) enforced
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
	return strings.Join(Baselines[:len(Baselines)-1], ", ") + " or " + Baselines[len(Baselines)-1]
}
