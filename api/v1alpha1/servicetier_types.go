package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceTierSpec is one tier of one pool.
type ServiceTierSpec struct {
	// poolRef names the ModelPool this tier belongs to. Immutable.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="poolRef is immutable"
	PoolRef LocalObjectReference `json:"poolRef"`

	// basePriority orders the tiers; lower is served sooner.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	BasePriority int32 `json:"basePriority"`

	// tolerableWait is the longest wait still useful to this tier (W_max).
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) > duration('0s')",message="tolerableWait must be a duration greater than 0, such as 5s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	TolerableWait metav1.Duration `json:"tolerableWait"`

	// tenantShare is the fraction of the pool one tenant may hold at once,
	// in (0, 1]. It is a quantity: write decimals quoted ("0.25") or with a
	// suffix (250m). A malformed quantity gets the pattern's message only.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || (quantity(string(self)).isGreaterThan(quantity('0')) && quantity(string(self)).compareTo(quantity('1')) <= 0)",message="tenantShare must be greater than 0 and at most 1"
	TenantShare resource.Quantity `json:"tenantShare"`

	// tenantLimits are the budgets, per minute and pool-wide, of each
	// tenant of this tier whose TenantQuota leaves them out, the pool's
	// defaultTier's tenants without a TenantQuota included.
	// +optional
	TenantLimits *Limits `json:"tenantLimits,omitempty"`
}

// ServiceTierStatus holds the bounds the controller derived for this tier.
type ServiceTierStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// queueBound is L_max for the whole pool. At zero ready replicas with
	// the pool's spec.coldStart set it is the bound for the first replica,
	// and 0 when this tier cannot be served in time: it is then refused.
	// +optional
	QueueBound int32 `json:"queueBound"`

	// tenantConcurrencyLimit is the default in-flight cap of one tenant.
	// +optional
	TenantConcurrencyLimit int32 `json:"tenantConcurrencyLimit,omitempty"`

	// tenantQueueLimit is how many requests one tenant may have queued.
	// +optional
	TenantQueueLimit int32 `json:"tenantQueueLimit,omitempty"`

	// queueTokenBound, when the pool's spec.tokens.boundBy is Tokens and
	// its token rate is known, bounds the queue instead of queueBound: the
	// weighted tokens the pool serves within min(W, clientTimeout), for the
	// whole pool. Absent otherwise; 0 at zero replicas as queueBound is.
	// +optional
	QueueTokenBound int64 `json:"queueTokenBound,omitempty"`

	// tenantQueueTokenLimit is the weighted tokens one tenant may have
	// queued, beside queueTokenBound.
	// +optional
	TenantQueueTokenLimit int64 `json:"tenantQueueTokenLimit,omitempty"`

	// maxWait is the stated worst-case wait under sustained overload for a
	// tenant under its own limits. At zero ready replicas with the pool's
	// spec.coldStart set it includes the cold start.
	// +optional
	MaxWait *metav1.Duration `json:"maxWait,omitempty"`

	// guarantee states maxWait and its conditions in words.
	// +optional
	Guarantee string `json:"guarantee,omitempty"`

	// conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ServiceTierReason is the Reason of a ServiceTier condition.
type ServiceTierReason string

// ServiceTier condition reasons.
const (
	ReasonBoundsComputed ServiceTierReason = "BoundsComputed"
	ReasonPoolNotFound   ServiceTierReason = "PoolNotFound"
	ReasonPoolNotReady   ServiceTierReason = "PoolNotReady"
	// ReasonTierHeldForColdStart: the pool is at zero and requests of the
	// tier are held for its first replica.
	ReasonTierHeldForColdStart ServiceTierReason = "HeldForColdStart"
	ReasonDuplicatePriority    ServiceTierReason = "DuplicateTier"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=st,categories=tiergate
// +kubebuilder:printcolumn:name="POOL",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="PRIORITY",type=integer,JSONPath=`.spec.basePriority`
// +kubebuilder:printcolumn:name="WAIT",type=string,JSONPath=`.spec.tolerableWait`
// +kubebuilder:printcolumn:name="SHARE",type=string,JSONPath=`.spec.tenantShare`
// +kubebuilder:printcolumn:name="BOUND",type=integer,JSONPath=`.status.queueBound`
// +kubebuilder:printcolumn:name="TENANT-LIMIT",type=integer,JSONPath=`.status.tenantConcurrencyLimit`
// +kubebuilder:printcolumn:name="TENANT-TPM",type=integer,JSONPath=`.spec.tenantLimits.tokensPerMinute`
// +kubebuilder:printcolumn:name="TOKEN-BOUND",type=integer,JSONPath=`.status.queueTokenBound`,priority=1
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`

// ServiceTier is one priority tier of a ModelPool.
type ServiceTier struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ServiceTierSpec   `json:"spec"`
	Status ServiceTierStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ServiceTierList is a list of ServiceTiers.
type ServiceTierList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServiceTier `json:"items"`
}
