package v1alpha1

// FairnessMode orders the requests within one tier.
// +kubebuilder:validation:Enum=Requests;Tokens
type FairnessMode string

const (
	// FairnessRequests serves a tier's requests by age (their ageing key),
	// whatever their size.
	FairnessRequests FairnessMode = "Requests"
	// FairnessTokens serves the oldest request of the tier's backlogged
	// tenant that was served the fewest weighted tokens per unit of weight
	// (a virtual token counter).
	FairnessTokens FairnessMode = "Tokens"
)

// MaxTokenWeight is the largest weight the schema takes: a token weight of
// spec.fairness or a TenantQuota's spec.weight.
const MaxTokenWeight = 1000

// Fairness is how the requests of one tier share its slots, and the
// weights of a request's cost in tokens: prompt × inputWeight + output ×
// outputWeight. The weights also price the token bounds
// (spec.tokens.boundBy Tokens) whatever the mode.
type Fairness struct {
	// mode is Requests (by age) or Tokens (by the tenants' weighted tokens
	// served).
	// +kubebuilder:default=Requests
	// +optional
	Mode FairnessMode `json:"mode,omitempty"`

	// inputWeight is the cost of one prompt token.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=1
	// +optional
	InputWeight int32 `json:"inputWeight,omitempty"`

	// outputWeight is the cost of one output token.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=2
	// +optional
	OutputWeight int32 `json:"outputWeight,omitempty"`
}

// QueueBoundBy says what a tier's queue bound counts.
// +kubebuilder:validation:Enum=Requests;Tokens
type QueueBoundBy string

const (
	// BoundByRequests bounds each tier's queue in requests, μ × min(W,
	// clientTimeout).
	BoundByRequests QueueBoundBy = "Requests"
	// BoundByTokens bounds each tier's queue in the weighted tokens the
	// pool serves within min(W, clientTimeout).
	BoundByTokens QueueBoundBy = "Tokens"
)

// MaxTokensPerSecond is the largest per-slot token rate the schema takes.
const MaxTokensPerSecond = 10_000_000
