package v1alpha1

// MaxBudgetPerMinute is the largest budget the schema takes: 10⁹ per
// minute, the largest the dispatchers' integer bucket maths keeps exact in
// Go and in Redis's Lua (the tokens package's MaxLimit; a test holds the
// two equal).
const MaxBudgetPerMinute = 1_000_000_000

// Limits are one tenant's budgets: token buckets that hold a minute's
// worth and refill continuously. A request that does not fit is refused
// at once with 429 rate_limited. A budget left out is no budget.
// +kubebuilder:validation:XValidation:rule="has(self.requestsPerMinute) || has(self.tokensPerMinute)",message="must set requestsPerMinute, tokensPerMinute or both (leave the field out for no budget)"
type Limits struct {
	// requestsPerMinute is how many requests the tenant may start per
	// minute.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	RequestsPerMinute int64 `json:"requestsPerMinute,omitempty"`

	// tokensPerMinute is how many tokens (prompt and output) the tenant's
	// requests may use per minute. A request reserves its estimate at
	// admission and settles on what its answer used.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	// +optional
	TokensPerMinute int64 `json:"tokensPerMinute,omitempty"`
}

// Tokens is how dispatchers count a request's tokens, and whether the
// queues are bounded in tokens.
// +kubebuilder:validation:XValidation:rule="has(self.prefillTokensPerSecond) == has(self.decodeTokensPerSecond)",message="tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond are set together or not at all"
type Tokens struct {
	// defaultMaxTokens is the output a request reserves when it names
	// neither max_completion_tokens nor max_tokens (times its n).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +kubebuilder:default=1024
	// +optional
	DefaultMaxTokens int32 `json:"defaultMaxTokens,omitempty"`

	// boundBy is what each tier's queue bound counts: Requests (μ ×
	// min(W, clientTimeout) requests) or Tokens (the weighted tokens the
	// pool serves in that time, spec.fairness's weights).
	// +kubebuilder:default=Requests
	// +optional
	BoundBy QueueBoundBy `json:"boundBy,omitempty"`

	// prefillTokensPerSecond is the prompt tokens one slot (one request
	// in flight on one replica) reads per second. With
	// decodeTokensPerSecond it declares the pool's token rate, which
	// boundBy Tokens needs unless spec.serviceTime.source is Measured.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000000
	// +optional
	PrefillTokensPerSecond int32 `json:"prefillTokensPerSecond,omitempty"`

	// decodeTokensPerSecond is the output tokens one slot writes per
	// second.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000000
	// +optional
	DecodeTokensPerSecond int32 `json:"decodeTokensPerSecond,omitempty"`
}

// LimitsSource says where the budgets in force for a tenant come from.
// +kubebuilder:validation:Enum=TenantQuota;ServiceTier;TenantQuotaAndServiceTier
type LimitsSource string

const (
	// LimitsFromTenantQuota says every budget in force is the quota's own
	// spec.limits.
	LimitsFromTenantQuota LimitsSource = "TenantQuota"
	// LimitsFromServiceTier says every budget in force is the tier's
	// spec.tenantLimits.
	LimitsFromServiceTier LimitsSource = "ServiceTier"
	// LimitsFromBoth says the quota sets one budget and the tier's
	// tenantLimits the other.
	LimitsFromBoth LimitsSource = "TenantQuotaAndServiceTier"
)

// LimitsStatus are the budgets in force for a tenant, pool-wide.
type LimitsStatus struct {
	// requestsPerMinute in force; absent when the tenant has none.
	// +optional
	RequestsPerMinute int64 `json:"requestsPerMinute,omitempty"`

	// tokensPerMinute in force; absent when the tenant has none.
	// +optional
	TokensPerMinute int64 `json:"tokensPerMinute,omitempty"`

	// source of the budgets: TenantQuota, ServiceTier or
	// TenantQuotaAndServiceTier (each budget falls back to the tier's on
	// its own).
	Source LimitsSource `json:"source"`

	// perDispatcher is how Local mode splits the budgets: each dispatcher
	// enforces its own part, so a tenant whose requests do not spread
	// evenly over the dispatchers gets less than its budget. Absent in
	// Redis mode, where every dispatcher shares one bucket and the budget
	// holds exactly.
	// +optional
	PerDispatcher *LimitsSplit `json:"perDispatcher,omitempty"`
}

// LimitsSplit is the Local-mode split of a tenant's budgets.
type LimitsSplit struct {
	// dispatchers is how many dispatchers serve and share the budgets;
	// the parts sum to each budget, unless it is smaller than this count
	// (no part is below 1, as 0 would be no budget at all). A dispatcher
	// that serves nothing (no slot) enforces 1.
	Dispatchers int32 `json:"dispatchers"`

	// requestsPerMinute is the smallest and the largest part of the
	// requests budget.
	// +optional
	RequestsPerMinute *BudgetRange `json:"requestsPerMinute,omitempty"`

	// tokensPerMinute is the smallest and the largest part of the tokens
	// budget.
	// +optional
	TokensPerMinute *BudgetRange `json:"tokensPerMinute,omitempty"`
}

// BudgetRange is the smallest and the largest per-dispatcher part of a
// budget; they differ by at most 1.
type BudgetRange struct {
	// min is the smallest part.
	Min int64 `json:"min"`
	// max is the largest part.
	Max int64 `json:"max"`
}
