package v1

// Authentication modes.
const (
	AuthTrustedHeader = "TrustedHeader"
	AuthAPIKey        = "APIKey"
	AuthJWT           = "JWT"
)

// Shared-state modes.
const (
	StateLocal = "Local"
	StateRedis = "Redis"
)

// Policy is everything a dispatcher knows about its pool. The controller
// computes one per dispatcher pod; a standalone dispatcher reads one from a
// file. Durations are seconds. Slots, queue bounds and tenant limits are this
// dispatcher's own share in Local mode and pool-wide in Redis mode.
type Policy struct {
	// SchemaVersion is the revision of this schema the document is
	// written in (SchemaVersion; absent is revision 0). A dispatcher
	// refuses a newer one (ErrUnsupportedSchema); the controller writes
	// each dispatcher the revision it declares (At).
	SchemaVersion int `json:"schemaVersion,omitempty"`
	// Version increases with every change; a dispatcher refuses an older one.
	Version int64 `json:"version"`
	// Pool is "namespace/name" of the ModelPool.
	Pool string `json:"pool"`
	// Slots is how many requests may be in flight at once.
	Slots int `json:"slots"`
	// ServiceRate is the drain rate in requests per second of the queue this
	// dispatcher's bounds describe, used for Retry-After until a tier's own
	// drain rate has been measured: in Local mode its own share, Slots / S,
	// and in Redis mode the pool-wide μ = P / S, since bounds are then
	// fleet-wide too.
	ServiceRate float64 `json:"serviceRate"`
	// AgeingRate is the seconds of waiting worth one priority point.
	AgeingRate float64 `json:"ageingRate"`
	// ClientTimeoutSeconds expires queued requests; 0 means no expiry.
	ClientTimeoutSeconds float64 `json:"clientTimeoutSeconds,omitempty"`
	// SharedState is Local (default) or Redis.
	SharedState string `json:"sharedState,omitempty"`
	// ColdStartSeconds is set, with Slots 0 and no backends, while the pool
	// is at zero replicas and its first replica is expected after this
	// long. The dispatcher then holds requests within each tier's
	// QueueBound (computed for that first replica) instead of refusing
	// them; a tier whose QueueBound is 0 is refused at once. 0 (absent)
	// with Slots 0 refuses every request.
	ColdStartSeconds float64 `json:"coldStartSeconds,omitempty"`

	Authentication Authentication `json:"authentication"`
	// DefaultTier takes tenants that have no entry in Tenants; empty
	// refuses them.
	DefaultTier string   `json:"defaultTier,omitempty"`
	ExemptPaths []string `json:"exemptPaths,omitempty"`

	Tiers    []Tier    `json:"tiers"`
	Tenants  []Tenant  `json:"tenants,omitempty"`
	Backends []Backend `json:"backends"`

	// Tokens is how the dispatcher estimates a request's tokens (schema
	// revision 2); nil uses DefaultMaxTokens.
	Tokens *Tokens `json:"tokens,omitempty"`

	// Fairness orders the requests within each tier (schema revision 3);
	// nil is FairnessRequests.
	Fairness *Fairness `json:"fairness,omitempty"`
	// TokenServiceRate is the drain rate in weighted tokens per second
	// of the queue this dispatcher's token bounds describe (its own share
	// in Local mode, the pool's in Redis mode, as ServiceRate), used for
	// Retry-After of a token-bound refusal until a tier's own token drain
	// rate has been measured (schema revision 3). 0 with token bounds
	// falls back on ServiceRate and the refused request's own cost.
	TokenServiceRate float64 `json:"tokenServiceRate,omitempty"`
}

// Fairness modes.
const (
	// FairnessRequests serves a tier's requests by their ageing key
	// alone, the order of revisions 0-2.
	FairnessRequests = "Requests"
	// FairnessTokens serves a tier's next slot to the oldest request of
	// its backlogged tenant with the smallest virtual token counter.
	FairnessTokens = "Tokens"
)

// Default token weights of a Fairness that names none.
const (
	DefaultInputWeight  = 1
	DefaultOutputWeight = 2
)

// Fairness is how the requests of one tier share its slots.
type Fairness struct {
	// Mode is FairnessRequests (also when empty) or FairnessTokens.
	Mode string `json:"mode,omitempty"`
	// InputWeight and OutputWeight weigh a request's prompt and output
	// tokens in its cost; 0 is DefaultInputWeight, DefaultOutputWeight.
	InputWeight  int `json:"inputWeight,omitempty"`
	OutputWeight int `json:"outputWeight,omitempty"`
}

// FairnessOf is p's fairness with its defaults filled in.
func (p *Policy) FairnessOf() Fairness {
	f := Fairness{Mode: FairnessRequests}
	if p.Fairness != nil {
		f = *p.Fairness
	}
	if f.Mode == "" {
		f.Mode = FairnessRequests
	}
	if f.InputWeight == 0 {
		f.InputWeight = DefaultInputWeight
	}
	if f.OutputWeight == 0 {
		f.OutputWeight = DefaultOutputWeight
	}
	return f
}

// Cost is a request's weighted tokens under f: prompt × InputWeight +
// output × OutputWeight; f must have its defaults filled (FairnessOf).
func (f Fairness) Cost(prompt, output int64) int64 {
	return prompt*int64(f.InputWeight) + output*int64(f.OutputWeight)
}

// DefaultMaxTokens is the output a request may use when it names no
// maximum and the policy gives no Tokens.DefaultMaxTokens.
const DefaultMaxTokens = 1024

// Tokens is the pool's token accounting.
type Tokens struct {
	// DefaultMaxTokens is the output tokens reserved for a request that
	// names neither max_completion_tokens nor max_tokens; 0 is
	// DefaultMaxTokens.
	DefaultMaxTokens int `json:"defaultMaxTokens,omitempty"`
}

// MaxTokens is the policy's default output reservation.
func (p *Policy) MaxTokens() int {
	if p.Tokens != nil && p.Tokens.DefaultMaxTokens > 0 {
		return p.Tokens.DefaultMaxTokens
	}
	return DefaultMaxTokens
}

// Limits are one tenant's budgets, each a token bucket that holds a
// minute's worth and refills continuously; 0 (absent) is no budget.
type Limits struct {
	RequestsPerMinute int64 `json:"requestsPerMinute,omitempty"`
	TokensPerMinute   int64 `json:"tokensPerMinute,omitempty"`
}

// IsZero says whether l sets no budget.
func (l Limits) IsZero() bool { return l.RequestsPerMinute == 0 && l.TokensPerMinute == 0 }

// LimitsOf are the budgets of tenant in tier: its own Limits when set,
// else the tier's TenantLimits, else none. Each of the two fields falls
// back on its own, so a tenant may set tokens and inherit requests.
func LimitsOf(tenant *Tenant, tier *Tier) Limits {
	var l Limits
	if tier != nil && tier.TenantLimits != nil {
		l = *tier.TenantLimits
	}
	if tenant != nil && tenant.Limits != nil {
		if tenant.Limits.RequestsPerMinute > 0 {
			l.RequestsPerMinute = tenant.Limits.RequestsPerMinute
		}
		if tenant.Limits.TokensPerMinute > 0 {
			l.TokensPerMinute = tenant.Limits.TokensPerMinute
		}
	}
	return l
}

// Authentication says how the dispatcher identifies a tenant.
type Authentication struct {
	Mode       string `json:"mode"`
	HeaderName string `json:"headerName,omitempty"`
	// TrustedSources, in TrustedHeader mode, are the CIDRs of the TCP peers
	// whose tenant header is believed; empty believes every peer.
	TrustedSources []string `json:"trustedSources,omitempty"`
	// JWT is the token check of JWT mode, keys included.
	JWT *JWT `json:"jwt,omitempty"`
}

// Tier is one priority tier with its derived bounds.
type Tier struct {
	Name                   string  `json:"name"`
	BasePriority           int     `json:"basePriority"`
	TolerableWaitSeconds   float64 `json:"tolerableWaitSeconds"`
	QueueBound             int     `json:"queueBound"`
	TenantConcurrencyLimit int     `json:"tenantConcurrencyLimit"`
	TenantQueueLimit       int     `json:"tenantQueueLimit"`
	// TenantLimits are the budgets of each tenant of the tier that sets
	// none of its own, the default tier's unknown tenants included
	// (schema revision 2).
	TenantLimits *Limits `json:"tenantLimits,omitempty"`
	// QueueTokenBound, when > 0, bounds the tier's queue in weighted
	// tokens (the reserved cost of its queued requests) instead of in
	// requests: the pool bounds by tokens (schema revision 3).
	QueueTokenBound int64 `json:"queueTokenBound,omitempty"`
	// TenantQueueTokenLimit, when > 0, is each tenant's share of
	// QueueTokenBound, as TenantQueueLimit is of QueueBound (schema
	// revision 3).
	TenantQueueTokenLimit int64 `json:"tenantQueueTokenLimit,omitempty"`
}

// Tenant is a known tenant. MaxConcurrency, when set, replaces the tier's
// tenantConcurrencyLimit.
type Tenant struct {
	ID             string   `json:"id"`
	Tier           string   `json:"tier"`
	MaxConcurrency int      `json:"maxConcurrency,omitempty"`
	APIKeySHA256   []string `json:"apiKeySHA256,omitempty"`
	// Limits are the tenant's own budgets (schema revision 2).
	Limits *Limits `json:"limits,omitempty"`
	// Weight divides the tenant's charged tokens in Tokens fairness: a
	// tenant of weight 2 gets twice the tokens of one of weight 1 while
	// both are backlogged; 0 is 1 (schema revision 3).
	Weight int `json:"weight,omitempty"`
}

// WeightOf is the tenant's fairness weight, 1 when unset.
func (tn *Tenant) WeightOf() int {
	if tn == nil || tn.Weight < 1 {
		return 1
	}
	return tn.Weight
}

// Backend is one ready model replica.
type Backend struct {
	Address string `json:"address"`
	Scheme  string `json:"scheme,omitempty"`
}

// Ack is the dispatcher's answer to a policy push. It carries what the
// dispatcher measured so the controller can follow the real service time.
type Ack struct {
	// Version is the policy version the dispatcher now holds.
	Version int64 `json:"version"`
	// SchemaVersion is the dispatcher's SchemaVersion (absent from a
	// dispatcher of revision 0), as in its SchemaHeader.
	SchemaVersion int      `json:"schemaVersion,omitempty"`
	Stats         Measured `json:"stats"`
}

// Measured is what a dispatcher observed since it started.
type Measured struct {
	// ServiceTimeSeconds is the mean time a served request held a slot (an
	// EWMA); 0 until Completed > 0.
	ServiceTimeSeconds float64 `json:"serviceTimeSeconds"`
	// Completed counts the served requests, the EWMA's samples: those that
	// got a 2xx answer from the backend and read it to its end. Failed,
	// abandoned and cancelled requests are not samples.
	Completed int64 `json:"completed"`
	// DrainRates is dispatches per second by tier (an EWMA).
	DrainRates map[string]float64 `json:"drainRates,omitempty"`
	// OfferedLoad is the requests per second that reached this dispatcher,
	// by tier: those it admitted plus those it refused for want of room
	// (cause capacity, and unavailable because it had no slots), averaged
	// over the recent past. Requests refused for a tenant's own limit,
	// authentication or a bad request are not offered load. Each
	// dispatcher counts only its own arrivals, in Local and Redis mode
	// alike, so the controller sums the dispatchers.
	OfferedLoad map[string]float64 `json:"offeredLoad,omitempty"`
	// Queued is how many admitted requests this dispatcher holds waiting
	// for a slot right now, held ones (Slots 0) included; its own count,
	// not the fleet's, in Redis mode too.
	Queued int64 `json:"queued,omitempty"`
	// UnknownKeyIDs are key IDs that JWTs named and the policy's JWKS does
	// not hold (at most MaxUnknownKeyIDs, sorted): the controller refetches
	// a JWKS URL when it sees one.
	UnknownKeyIDs []string `json:"unknownKeyIDs,omitempty"`
	// TokensPerSlotSecond is the weighted tokens (the policy's Fairness
	// weights) of the served requests' settled usage per second they held
	// a slot, an EWMA; 0 until a served request reported usage. It is the
	// measured rate behind token bounds when the pool's service time is
	// Measured.
	TokensPerSlotSecond float64 `json:"tokensPerSlotSecond,omitempty"`
}
