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
}
