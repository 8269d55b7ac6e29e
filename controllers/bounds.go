package controllers

// bounds.go is the pure computation of DESIGN.md section 4: from a pool's
// spec and its observed size to the status values and to one Policy per
// dispatcher. It touches no API server and no clock, so the reconciler and
// `tiergate simulate` share it.
//
// API (stable; other packages build on it):
//
//	type BoundsInput struct {
//		Pool                *v1alpha1.ModelPool     // spec is read; Namespace/Name name the policy's pool
//		ReadyReplicas       int32                   // R, the Deployment's status.readyReplicas
//		Tiers               []v1alpha1.ServiceTier  // the pool's tiers (any order)
//		Quotas              []v1alpha1.TenantQuota  // quotas whose tierRef may name one of Tiers
//		Dispatchers         int                     // N dispatcher pods; 0 yields no Policies
//		ObservedServiceTime time.Duration           // used as S only when serviceTime.source is Measured and > 0
//		Backends            []policy.Backend        // the Ready model pods, copied into every Policy
//		APIKeyHashes        map[string][]string     // TenantQuota name -> lowercase hex SHA-256 of its keys
//	}
//	func ComputeBounds(in BoundsInput) (Bounds, error) // errors wrap ErrInvalidInput
//	func (b Bounds) PolicyFor(i int) policy.Policy     // == b.Policies[i]; Version is left 0 for the caller
//
//	type Bounds struct {
//		Pool     PoolBounds
//		Tiers    []TierBounds   // by basePriority, then name
//		Tenants  []TenantBounds // one per input quota, by quota name
//		Policies []policy.Policy // len == Dispatchers
//	}
//
// All rounding is done in exact integer or rational arithmetic, so
// floor(4/s × 5s) is 20 and never 19.

import (
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/dispatcher/policy"
)

// DefaultAgeingRate applies when spec.ageing sets neither rate nor
// starvationBound (objects read from files, before API-server defaulting).
const DefaultAgeingRate = 6 * time.Second

// ErrInvalidInput is wrapped by every error ComputeBounds returns.
var ErrInvalidInput = errors.New("invalid bounds input")

// BoundsInput is everything the computation depends on.
type BoundsInput struct {
	// Pool supplies the spec and, through Namespace/Name, the policy's pool
	// name. Its status is not read.
	Pool *v1alpha1.ModelPool
	// ReadyReplicas is R.
	ReadyReplicas int32
	// Tiers are the pool's ServiceTiers.
	Tiers []v1alpha1.ServiceTier
	// Quotas are TenantQuotas; one whose tier is not among Tiers is
	// reported TierNotFound and left out of the policies.
	Quotas []v1alpha1.TenantQuota
	// Dispatchers is the number of dispatcher pods that receive a policy.
	Dispatchers int
	// ObservedServiceTime replaces spec.serviceTime.mean when the source is
	// Measured and it is positive.
	ObservedServiceTime time.Duration
	// Backends are the Ready model pods.
	Backends []policy.Backend
	// APIKeyHashes maps a TenantQuota's name to the SHA-256 hashes (lowercase
	// hex) of its API keys.
	APIKeyHashes map[string][]string
}

// Bounds is the result: status values and the per-dispatcher policies.
type Bounds struct {
	Pool     PoolBounds
	Tiers    []TierBounds
	Tenants  []TenantBounds
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
	// AgeingHorizon is AgeingRate × (max base − min base): how long the
	// lowest tier can wait behind the highest.
	AgeingHorizon time.Duration
	// ClientTimeout is spec.clientTimeout, 0 when unset.
	ClientTimeout time.Duration
	// HorizonExceedsClientTimeout is true when ClientTimeout is set and
	// AgeingHorizon is longer: the ageing guarantee is then void.
	HorizonExceedsClientTimeout bool
	// NoReadyReplicas is true when P is 0: nothing can be served.
	NoReadyReplicas bool
	// TotalQueueBound is Σ L over the tiers.
	TotalQueueBound int64
	// DefaultTierNotFound is true when spec.defaultTier names no tier; the
	// policies then carry no default tier (unknown tenants are refused).
	DefaultTierNotFound bool
}

// TierBounds are one tier's status values; all are pool-wide.
type TierBounds struct {
	Name          string
	BasePriority  int32
	TolerableWait time.Duration
	// QueueBound is L = max(1, floor(μ × min(W, clientTimeout))).
	QueueBound int32
	// TenantConcurrencyLimit is max(1, floor(P × share)).
	TenantConcurrencyLimit int32
	// TenantQueueLimit is max(1, floor(L × share)).
	TenantQueueLimit int32
	// MaxWait is ageingRate × (base − base_min) + ΣL/μ + S, rounded up to
	// the nanosecond. It is 0 when Unbounded.
	MaxWait time.Duration
	// Unbounded is true when P is 0: no wait can be promised.
	Unbounded bool
	// MaxWaitExceedsClientTimeout is true when clientTimeout is set and
	// MaxWait is longer.
	MaxWaitExceedsClientTimeout bool
	// Guarantee states MaxWait and its conditions in words.
	Guarantee string
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
}

// PolicyFor returns dispatcher i's policy (0 <= i < len(b.Policies)). Its
// Version is 0; the caller sets it.
func (b Bounds) PolicyFor(i int) policy.Policy { return b.Policies[i] }

// ComputeBounds derives the bounds of DESIGN.md section 4. It is pure and
// deterministic: the same input always gives the same output.
func ComputeBounds(in BoundsInput) (Bounds, error) {
	if err := validateInput(in); err != nil {
		return Bounds{}, err
	}
	spec := &in.Pool.Spec

	// S, P and μ.
	s := spec.ServiceTime.Mean.Duration
	src := spec.ServiceTime.Source
	if src == "" {
		src = v1alpha1.ServiceTimeDeclared
	}
	if src == v1alpha1.ServiceTimeMeasured && in.ObservedServiceTime > 0 {
		s = in.ObservedServiceTime
	}
	p := int64(in.ReadyReplicas) * int64(spec.ConcurrencyPerReplica)
	if p > maxInt32 {
		return Bounds{}, fmt.Errorf("%w: readyReplicas × concurrencyPerReplica = %d exceeds %d", ErrInvalidInput, p, maxInt32)
	}
	mu := new(big.Rat).SetFrac(big.NewInt(p*int64(time.Second)), big.NewInt(int64(s))) // per second
	muF, _ := mu.Float64()

	var clientTimeout time.Duration
	if spec.ClientTimeout != nil {
		clientTimeout = spec.ClientTimeout.Duration
	}

	tiers := sortedTiers(in.Tiers)
	minBase, maxBase := int32(0), int32(0)
	for i, t := range tiers {
		if i == 0 || t.Spec.BasePriority < minBase {
			minBase = t.Spec.BasePriority
		}
		if i == 0 || t.Spec.BasePriority > maxBase {
			maxBase = t.Spec.BasePriority
		}
	}
	ageing := ageingRate(spec.Ageing, maxBase-minBase)
	horizon := ageing * time.Duration(maxBase-minBase)

	out := Bounds{Pool: PoolBounds{
		ReadyReplicas:               in.ReadyReplicas,
		Concurrency:                 int32(p),
		ServiceTime:                 s,
		ServiceTimeSource:           src,
		ServiceRate:                 muF,
		ServiceRateString:           decimalString(mu, 3),
		AgeingRate:                  ageing,
		AgeingHorizon:               horizon,
		ClientTimeout:               clientTimeout,
		HorizonExceedsClientTimeout: clientTimeout > 0 && horizon > clientTimeout,
		NoReadyReplicas:             p == 0,
	}}

	// Tier bounds.
	tierIndex := make(map[string]int, len(tiers))
	shares := make([]*big.Rat, len(tiers))
	for i, t := range tiers {
		w := t.Spec.TolerableWait.Duration
		weff := w
		if clientTimeout > 0 && clientTimeout < weff {
			weff = clientTimeout
		}
		// L = floor(P × Weff / S), in nanoseconds on both sides.
		l := atLeastOne(clampInt32(floorDiv(new(big.Int).Mul(big.NewInt(p), big.NewInt(int64(weff))), big.NewInt(int64(s)))))
		shares[i] = shareRat(t.Spec.TenantShare)
		tenantLimit := atLeastOne(clampInt32(floorRat(new(big.Rat).Mul(new(big.Rat).SetInt64(p), shares[i]))))
		tenantQueue := atLeastOne(clampInt32(floorRat(new(big.Rat).Mul(new(big.Rat).SetInt64(l), shares[i]))))
		out.Tiers = append(out.Tiers, TierBounds{
			Name:                   t.Name,
			BasePriority:           t.Spec.BasePriority,
			TolerableWait:          w,
			QueueBound:             int32(l),
			TenantConcurrencyLimit: int32(tenantLimit),
			TenantQueueLimit:       int32(tenantQueue),
		})
		tierIndex[t.Name] = i
		out.Pool.TotalQueueBound += l
	}

	// maxWait(t) = ageing × (base_t − base_min) + ΣL × S / P + S.
	for i := range out.Tiers {
		tb := &out.Tiers[i]
		behind := ageing * time.Duration(tb.BasePriority-minBase)
		if p == 0 {
			tb.Unbounded = true
		} else {
			drain := ceilDiv(new(big.Int).Mul(big.NewInt(out.Pool.TotalQueueBound), big.NewInt(int64(s))), big.NewInt(p))
			tb.MaxWait = behind + time.Duration(drain) + s
			tb.MaxWaitExceedsClientTimeout = clientTimeout > 0 && tb.MaxWait > clientTimeout
		}
		tb.Guarantee = guarantee(*tb, out.Pool, tiers[0].Name, behind, tb.BasePriority == minBase)
	}

	// Tenants: sorted by quota name; the oldest quota of a tenant ID wins.
	quotas := append([]v1alpha1.TenantQuota(nil), in.Quotas...)
	sort.Slice(quotas, func(a, b int) bool { return quotas[a].Name < quotas[b].Name })
	owner := map[string]string{} // tenant ID -> quota name in force
	byAge := append([]v1alpha1.TenantQuota(nil), quotas...)
	sort.SliceStable(byAge, func(a, b int) bool {
		ta, tb := byAge[a].CreationTimestamp, byAge[b].CreationTimestamp
		if !ta.Equal(&tb) {
			return ta.Before(&tb)
		}
		return byAge[a].Name < byAge[b].Name
	})
	for _, q := range byAge {
		if _, ok := tierIndex[q.Spec.TierRef.Name]; !ok {
			continue
		}
		if _, taken := owner[q.Spec.Tenant]; !taken {
			owner[q.Spec.Tenant] = q.Name
		}
	}
	type liveTenant struct {
		bounds   TenantBounds
		override int32 // 0 when none
		hashes   []string
	}
	var live []liveTenant
	for _, q := range quotas {
		tb := TenantBounds{QuotaName: q.Name, Tenant: q.Spec.Tenant, Tier: q.Spec.TierRef.Name, APIKeys: len(in.APIKeyHashes[q.Name])}
		ti, ok := tierIndex[q.Spec.TierRef.Name]
		switch {
		case !ok:
			tb.TierNotFound = true
		case owner[q.Spec.Tenant] != q.Name:
			tb.Duplicate = true
			tb.DuplicateOf = owner[q.Spec.Tenant]
		default:
			var override int32
			tb.EffectiveLimit = out.Tiers[ti].TenantConcurrencyLimit
			if q.Spec.MaxConcurrency != nil {
				override = *q.Spec.MaxConcurrency
				tb.EffectiveLimit = override
			}
			live = append(live, liveTenant{bounds: tb, override: override, hashes: in.APIKeyHashes[q.Name]})
		}
		out.Tenants = append(out.Tenants, tb)
	}
	sort.SliceStable(live, func(a, b int) bool { return live[a].bounds.Tenant < live[b].bounds.Tenant })
	claimed := map[string]bool{}
	shared := map[string]int{} // quota name -> hashes dropped
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
	for i := range out.Tenants {
		out.Tenants[i].SharedKeys = shared[out.Tenants[i].QuotaName]
	}
	defaultTier := spec.DefaultTier
	if _, ok := tierIndex[defaultTier]; defaultTier != "" && !ok {
		out.Pool.DefaultTierNotFound = true
		defaultTier = ""
	}

	// Per-dispatcher policies.
	redis := spec.SharedState == v1alpha1.SharedStateRedis
	slots := splitSlots(p, in.Dispatchers)
	auth := policy.Authentication{Mode: string(spec.Authentication.Mode), HeaderName: spec.Authentication.HeaderName}
	if auth.Mode == "" {
		auth.Mode = policy.AuthTrustedHeader
	}
	if auth.Mode == policy.AuthTrustedHeader && auth.HeaderName == "" {
		auth.HeaderName = "X-Tenant-ID"
	}
	if auth.Mode == policy.AuthAPIKey {
		auth.HeaderName = ""
	}
	sharedState := policy.StateLocal
	if redis {
		sharedState = policy.StateRedis
	}
	for i := 0; i < in.Dispatchers; i++ {
		mine := p
		if !redis {
			mine = slots[i]
		}
		// scale takes a pool-wide number to this dispatcher's share.
		scale := func(v int32) int {
			if redis || p == 0 {
				return int(v)
			}
			return int(atLeastOne(floorDiv(new(big.Int).Mul(big.NewInt(int64(v)), big.NewInt(mine)), big.NewInt(p)).Int64()))
		}
		pol := policy.Policy{
			Pool:                 in.Pool.Namespace + "/" + in.Pool.Name,
			Slots:                int(mine),
			ServiceRate:          muF,
			AgeingRate:           ageing.Seconds(),
			ClientTimeoutSeconds: clientTimeout.Seconds(),
			SharedState:          sharedState,
			Authentication:       auth,
			DefaultTier:          defaultTier,
			ExemptPaths:          append([]string(nil), spec.ExemptPaths...),
			Tiers:                make([]policy.Tier, 0, len(out.Tiers)),
			Backends:             append([]policy.Backend{}, in.Backends...),
		}
		if !redis && p > 0 {
			// This dispatcher drains its own slice of the pool.
			r, _ := new(big.Rat).SetFrac(big.NewInt(mine*int64(time.Second)), big.NewInt(int64(s))).Float64()
			pol.ServiceRate = r
		}
		for _, tb := range out.Tiers {
			pol.Tiers = append(pol.Tiers, policy.Tier{
				Name:                   tb.Name,
				BasePriority:           int(tb.BasePriority),
				TolerableWaitSeconds:   tb.TolerableWait.Seconds(),
				QueueBound:             scale(tb.QueueBound),
				TenantConcurrencyLimit: scale(tb.TenantConcurrencyLimit),
				TenantQueueLimit:       scale(tb.TenantQueueLimit),
			})
		}
		for _, lt := range live {
			t := policy.Tenant{ID: lt.bounds.Tenant, Tier: lt.bounds.Tier}
			if lt.override > 0 {
				t.MaxConcurrency = scale(lt.override)
			}
			if len(lt.hashes) > 0 {
				t.APIKeySHA256 = append([]string(nil), lt.hashes...)
			}
			pol.Tenants = append(pol.Tenants, t)
		}
		out.Policies = append(out.Policies, pol)
	}
	return out, nil
}

const maxInt32 = 1<<31 - 1

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

func validateInput(in BoundsInput) error {
	var errs []string
	if in.Pool == nil {
		return fmt.Errorf("%w: no pool", ErrInvalidInput)
	}
	spec := &in.Pool.Spec
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
	if in.ReadyReplicas < 0 {
		errs = append(errs, fmt.Sprintf("readyReplicas: %d must not be negative", in.ReadyReplicas))
	}
	if in.Dispatchers < 0 {
		errs = append(errs, fmt.Sprintf("dispatchers: %d must not be negative", in.Dispatchers))
	}
	seen := map[string]bool{}
	for _, t := range in.Tiers {
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
	}
	for _, q := range in.Quotas {
		if q.Spec.MaxConcurrency != nil && *q.Spec.MaxConcurrency < 1 {
			errs = append(errs, fmt.Sprintf("quota %q: spec.maxConcurrency %d must be at least 1", q.Name, *q.Spec.MaxConcurrency))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidInput, strings.Join(errs, "; "))
	}
	return nil
}

// ageingRate applies spec.ageing. spread is max base − min base. With
// starvationBound and a spread of 0 (one tier, or all bases equal) there is
// nothing to climb, so the bound itself is used as the rate: it keeps the
// horizon 0 and still orders equal-base work by arrival.
func ageingRate(a v1alpha1.Ageing, spread int32) time.Duration {
	switch {
	case a.Rate != nil:
		return a.Rate.Duration
	case a.StarvationBound != nil:
		if spread <= 0 {
			return a.StarvationBound.Duration
		}
		return a.StarvationBound.Duration / time.Duration(spread)
	default:
		return DefaultAgeingRate
	}
}

// splitSlots spreads p over n dispatchers as evenly as whole numbers allow;
// the first p mod n dispatchers get one more. The slices sum to p.
func splitSlots(p int64, n int) []int64 {
	if n <= 0 {
		return nil
	}
	out := make([]int64, n)
	base, rem := p/int64(n), p%int64(n)
	for i := range out {
		out[i] = base
		if int64(i) < rem {
			out[i]++
		}
	}
	return out
}

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

// shareRat is the Quantity as an exact rational (Quantity keeps an exact
// decimal; a float64 would turn 0.1 into 0.1000000000000000055...).
func shareRat(q resource.Quantity) *big.Rat {
	d := q.AsDec() // q is a copy; AsDec converts it in place
	unscaled := d.UnscaledBig()
	scale := int64(d.Scale())
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(abs64(scale)), nil)
	if scale >= 0 {
		return new(big.Rat).SetFrac(unscaled, pow)
	}
	return new(big.Rat).SetInt(new(big.Int).Mul(unscaled, pow))
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// floorDiv is floor(a/b) for b > 0 (Euclidean division floors then).
func floorDiv(a, b *big.Int) *big.Int {
	q, _ := new(big.Int).DivMod(a, b, new(big.Int))
	return q
}

func ceilDiv(a, b *big.Int) int64 {
	q, m := new(big.Int).DivMod(a, b, new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 1<<63 - 1
	}
	return q.Int64()
}

func floorRat(r *big.Rat) *big.Int { return floorDiv(r.Num(), r.Denom()) }

func clampInt32(v *big.Int) int64 {
	if v.Cmp(big.NewInt(maxInt32)) > 0 {
		return maxInt32
	}
	return v.Int64()
}

func atLeastOne(v int64) int64 {
	if v < 1 {
		return 1
	}
	return v
}

// decimalString formats r with at most prec decimals, trailing zeros cut.
func decimalString(r *big.Rat, prec int) string {
	s := r.FloatString(prec)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// guarantee says MaxWait in words, with the conditions under which it holds.
func guarantee(t TierBounds, pool PoolBounds, topTier string, behind time.Duration, top bool) string {
	if t.Unbounded {
		return fmt.Sprintf("No wait is guaranteed for tier %s: the pool has no ready replicas, so nothing is served.", t.Name)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Under sustained overload a %s request whose tenant is under its own limits waits at most %s", t.Name, t.MaxWait)
	fmt.Fprintf(&b, ": %s of ageing behind %s work, %s to drain at most %d queued requests at %s req/s, and one service time of %s.",
		behind, topTier, t.MaxWait-behind-pool.ServiceTime, pool.TotalQueueBound, pool.ServiceRateString, pool.ServiceTime)
	if top {
		b.WriteString(" Older lower-tier requests that have aged past it may be served first; that cost is inside this bound.")
	}
	b.WriteString(" A tenant at its own limit also waits for its own earlier requests.")
	if t.MaxWaitExceedsClientTimeout {
		fmt.Fprintf(&b, " This exceeds the client timeout of %s, so under sustained overload such a request may expire instead of being served.", pool.ClientTimeout)
	}
	return b.String()
}
