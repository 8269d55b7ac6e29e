package capacity

import (
	"errors"
	"math/big"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// ErrInvalidInput is wrapped by every error ComputeBounds returns.
var ErrInvalidInput = errors.New("invalid bounds input")

// BoundsInput is everything the computation depends on.
type BoundsInput struct {
	// Pool supplies the spec and, through Namespace/Name, the policy's pool
	// name. Its status is not read.
	Pool *v1alpha1.ModelPool
	// ReadyReplicas is R.
	ReadyReplicas int32
	// Tiers are the pool's ServiceTiers, in any order.
	Tiers []v1alpha1.ServiceTier
	// Quotas are TenantQuotas; one whose tier is not among Tiers is
	// reported TierNotFound and left out of the policies.
	Quotas []v1alpha1.TenantQuota
	// Dispatchers is the number of dispatcher pods that receive a policy;
	// 0 yields no Policies.
	Dispatchers int
	// Excluded, when not nil, has one entry per dispatcher: true for one
	// that holds no share of the slots in Local mode (a failing pod). The
	// slots are split among the others, or among all when every one is
	// excluded. Redis mode ignores it: every dispatcher holds the
	// pool-wide numbers and only uses what it takes.
	Excluded []bool
	// ObservedServiceTime replaces spec.serviceTime.mean when the source is
	// Measured and it is positive.
	ObservedServiceTime time.Duration
	// ObservedTokenRate, the weighted tokens per slot-second the
	// dispatchers measured, replaces the declared token rate when the
	// source is Measured and it is positive (tokenbounds.go).
	ObservedTokenRate float64
	// Backends are the Ready model pods, copied into every Policy.
	Backends []policy.Backend
	// APIKeyHashes maps a TenantQuota's name to the SHA-256 hashes (lowercase
	// hex) of its API keys.
	APIKeyHashes map[string][]string
	// JWKS are the public keys of a JWT-mode pool, as the controller read
	// them; nil pushes an empty key set.
	JWKS *policy.JWKS
}

// Bounds is the result: status values and the per-dispatcher policies.
type Bounds struct {
	Pool PoolBounds
	// Tiers are sorted by basePriority, then name.
	Tiers []TierBounds
	// Tenants has one entry per input quota, sorted by quota name.
	Tenants []TenantBounds
	// Policies has one entry per dispatcher; their Version is 0.
	Policies []policy.Policy
}

// PoolBounds are the pool-wide values of ModelPool status.
type PoolBounds struct {
	ReadyReplicas int32
	// Concurrency is P = R × C.
	Concurrency int32
	// ServiceTime is the effective S.
	ServiceTime time.Duration
	// ServiceTimeSource is Declared or Measured (what S came from).
	ServiceTimeSource v1alpha1.ServiceTimeSource
	// ServiceRate is μ = P / S in requests per second.
	ServiceRate float64
	// ServiceRateString is μ as a decimal string with at most three
	// decimals, for status.serviceRate.
	ServiceRateString string
	// AgeingRate is the waiting time worth one priority point.
	AgeingRate time.Duration
	// AgeingSpread is max base − min base: the points the lowest tier's
	// requests climb.
	AgeingSpread int32
	// AgeingHorizon is AgeingRate × AgeingSpread: how long the lowest tier
	// can wait behind the highest (saturated at the longest Duration).
	AgeingHorizon time.Duration
	// ClientTimeout is spec.clientTimeout, 0 when unset.
	ClientTimeout time.Duration
	// HorizonExceedsClientTimeout is true when ClientTimeout is set and
	// AgeingHorizon is longer: the ageing guarantee is then void.
	HorizonExceedsClientTimeout bool
	// NoReadyReplicas is true when P is 0: nothing is served now.
	NoReadyReplicas bool
	// ColdStart is spec.coldStart while the pool is at zero ready
	// replicas, and 0 otherwise. When set, the bounds are those of the
	// first replica, serving after ColdStart: dispatchers hold requests
	// within them.
	ColdStart time.Duration
	// FirstReplicaRate is μ₁ = C / S in requests per second while
	// ColdStart is set, else 0; FirstReplicaRateString is the same as
	// ServiceRateString is.
	FirstReplicaRate       float64
	FirstReplicaRateString string
	// TotalQueueBound is Σ L over the tiers.
	TotalQueueBound int64
	// DefaultTierNotFound is true when spec.defaultTier names no tier; the
	// policies then carry no default tier (unknown tenants are refused).
	DefaultTierNotFound bool
	// TokenRate is r, the weighted tokens one slot serves per second,
	// behind the tiers' QueueTokenBound; 0 when they are bounded by
	// requests (spec.tokens.boundBy Requests, or no rate known).
	// TokenRateString is r with at most three decimals, "" when 0, and
	// TokenRateSource says whether r was Declared or Measured.
	TokenRate       float64
	TokenRateString string
	TokenRateSource v1alpha1.ServiceTimeSource
	// TokenServiceRate is the weighted tokens per second the slots the
	// bounds describe serve: P × r (C × r while held).
	TokenServiceRate float64
}

// TierBounds are one tier's status values; all are pool-wide.
type TierBounds struct {
	Name          string
	BasePriority  int32
	TolerableWait time.Duration
	// QueueBound is L = max(1, floor(μ × min(W, clientTimeout))); while
	// the pool is at zero with a cold start, max(0, floor(μ₁ ×
	// (min(W, clientTimeout) − coldStart))), and 0 refuses the tier; at
	// zero without a cold start, 0 (every request is refused).
	QueueBound int32
	// TenantConcurrencyLimit is max(1, floor(P × share)).
	TenantConcurrencyLimit int32
	// TenantQueueLimit is max(1, floor(L × share)).
	TenantQueueLimit int32
	// QueueTokenBound is the tier's bound in weighted tokens, max(1,
	// floor(P × r × min(W, clientTimeout))) (C and the wait after the
	// cold start while held), 0 when QueueBound is 0 or the pool bounds
	// by requests; TenantQueueTokenLimit is max(1, floor(it × share)),
	// 0 beside a QueueTokenBound of 0.
	QueueTokenBound       int64
	TenantQueueTokenLimit int64
	// MaxWait is ageingRate × (base − base_min) + ΣL/μ + S, rounded up to
	// the nanosecond; while the pool is at zero with a cold start,
	// coldStart + ageingRate × (base − base_min) + ΣL/μ₁ + S. It is 0 when
	// Unbounded.
	MaxWait time.Duration
	// Unbounded is true when no wait can be promised: P is 0 and no cold
	// start is set, or the pool is at zero and this tier's bound is 0.
	Unbounded bool
	// MaxWaitExceedsClientTimeout is true when clientTimeout is set and
	// MaxWait is longer.
	MaxWaitExceedsClientTimeout bool
	// Guarantee states MaxWait and its conditions in words.
	Guarantee string
	// TenantLimits are spec.tenantLimits, pool-wide: the budgets of each
	// tenant of the tier whose quota leaves them out; nil when none.
	TenantLimits *policy.Limits
}

// TenantBounds is one TenantQuota's outcome.
type TenantBounds struct {
	QuotaName string
	Tenant    string
	Tier      string
	// EffectiveLimit is the pool-wide in-flight cap: maxConcurrency when set,
	// else the tier's TenantConcurrencyLimit. 0 when the quota is not in
	// force (TierNotFound or Duplicate).
	EffectiveLimit int32
	// TierNotFound is true when the quota's tier is not one of the pool's.
	TierNotFound bool
	// Duplicate is true when an older quota (by creation time, then name)
	// already claims the same tenant ID; only that one is in force.
	Duplicate bool
	// DuplicateOf names the quota in force for the same tenant.
	DuplicateOf string
	// APIKeys is the number of key hashes given for this quota.
	APIKeys int
	// SharedKeys counts this quota's key hashes already claimed by another
	// tenant (earlier by tenant ID); they are left out of its policy entry,
	// because one key cannot name two tenants.
	SharedKeys int
	// Limits are the budgets in force, pool-wide: each of the quota's
	// spec.limits, else of its tier's spec.tenantLimits
	// (policy.LimitsOf). Zero when it has none or is not in force.
	Limits policy.Limits
	// LimitsSource says where Limits come from; "" when they are zero.
	LimitsSource v1alpha1.LimitsSource
	// LimitsSplit is how Local mode splits Limits over the dispatchers
	// (budgets.go); nil in Redis mode, without budgets or dispatchers.
	LimitsSplit *LimitsSplit
	// Weight is the tenant's fairness weight, spec.weight (1 when unset);
	// 0 when the quota is not in force.
	Weight int32
}

// PolicyFor returns dispatcher i's policy (0 <= i < len(b.Policies)). Its
// Version is 0; the caller sets it.
func (b Bounds) PolicyFor(i int) policy.Policy { return b.Policies[i] }

// ComputeBounds derives the bounds of docs/architecture.md#the-bounds. Errors wrap
// ErrInvalidInput. The input is not modified.
func ComputeBounds(in BoundsInput) (Bounds, error) {
	if err := validateInput(in); err != nil {
		return Bounds{}, err
	}
	spec := in.Pool.Spec // ApplyDefaults never writes through the copy's pointers
	ApplyDefaults(&spec)
	r, err := poolRates(&spec, in.ReadyReplicas, in.ObservedServiceTime)
	if err != nil {
		return Bounds{}, err
	}
	r.tokens, r.tokenSource = tokenRate(&spec, in.ObservedTokenRate)
	tiers := sortedTiers(in.Tiers)
	out := Bounds{Pool: poolBounds(&spec, r, tiers)}
	out.Tiers = tierBounds(r, tiers, out.Pool.ClientTimeout)
	tierTokenBounds(out.Tiers, tiers, r, out.Pool.ClientTimeout)
	for _, tb := range out.Tiers {
		out.Pool.TotalQueueBound += int64(tb.QueueBound)
	}
	stateMaxWaits(out.Tiers, out.Pool, r)

	var live []liveTenant
	out.Tenants, live = tenantBounds(in.Quotas, out.Tiers, in.APIKeyHashes)
	defaultTier := spec.DefaultTier
	if defaultTier != "" && !hasTier(out.Tiers, defaultTier) {
		out.Pool.DefaultTierNotFound = true
		defaultTier = ""
	}

	base := basePolicy(in.Pool, &spec, out.Pool, defaultTier, in.JWKS)
	var budgets budgetSplit
	out.Policies, budgets = splitPolicies(base, r, out.Tiers, live, in.Backends, in.Dispatchers, in.Excluded)
	for i := range out.Tenants {
		out.Tenants[i].LimitsSplit = budgets.summary(out.Tenants[i].Limits)
	}
	return out, nil
}

// poolBounds are the pool-wide values; TotalQueueBound and
// DefaultTierNotFound are set once the tiers are known.
func poolBounds(spec *v1alpha1.ModelPoolSpec, r rates, tiers []v1alpha1.ServiceTier) PoolBounds {
	var clientTimeout time.Duration
	if spec.ClientTimeout != nil {
		clientTimeout = spec.ClientTimeout.Duration
	}
	spread := baseSpread(tiers)
	ageing := ageingRate(spec.Ageing, spread)
	horizon := mulDuration(ageing, int64(spread))
	mu := r.serviceRate()
	muF, _ := mu.Float64()
	var first *big.Rat
	if r.held() {
		first = r.boundsRate()
	}
	return PoolBounds{
		ReadyReplicas:               r.replicas,
		Concurrency:                 int32(r.concurrency),
		ServiceTime:                 r.serviceTime,
		ServiceTimeSource:           r.source,
		ServiceRate:                 muF,
		ServiceRateString:           decimalString(mu, 3),
		AgeingRate:                  ageing,
		AgeingSpread:                spread,
		AgeingHorizon:               saturate(horizon),
		ClientTimeout:               clientTimeout,
		HorizonExceedsClientTimeout: clientTimeout > 0 && longer(horizon, clientTimeout),
		NoReadyReplicas:             r.concurrency == 0,
		ColdStart:                   r.coldStart,
		FirstReplicaRate:            ratFloat(first),
		FirstReplicaRateString:      ratString(first),
		TokenRate:                   ratFloat(r.tokens),
		TokenRateString:             ratString(r.tokens),
		TokenRateSource:             r.tokenSource,
		TokenServiceRate:            tokenServiceRate(r.tokens, r.boundsFor),
	}
}

// ratFloat and ratString read an optional rate; nil is 0 and "".
func ratFloat(q *big.Rat) float64 {
	if q == nil {
		return 0
	}
	f, _ := q.Float64()
	return f
}

func ratString(q *big.Rat) string {
	if q == nil {
		return ""
	}
	return decimalString(q, 3)
}
