package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecretKeysReference names keys of a Secret in the same namespace.
type SecretKeysReference struct {
	// name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// keys whose values are API keys. Empty means every key of the Secret.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Keys []string `json:"keys,omitempty"`
}

// TenantQuotaSpec assigns one tenant to a tier.
type TenantQuotaSpec struct {
	// tenant is the tenant ID as dispatchers see it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._:@-]*$`
	Tenant string `json:"tenant"`

	// tierRef names the tenant's ServiceTier. Immutable.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="tierRef is immutable"
	TierRef LocalObjectReference `json:"tierRef"`

	// maxConcurrency overrides the tier's share-derived in-flight cap.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxConcurrency *int32 `json:"maxConcurrency,omitempty"`

	// apiKeySecretRef holds this tenant's API keys (APIKey mode). Only their
	// SHA-256 hashes leave the controller. The Secret must carry the label
	// tiergate.dev/api-keys: "true"; the controller reads no other Secret.
	// +optional
	APIKeySecretRef *SecretKeysReference `json:"apiKeySecretRef,omitempty"`

	// limits are the tenant's own budgets, per minute, pool-wide. Each
	// budget it leaves out falls back to the tier's spec.tenantLimits.
	// +optional
	Limits *Limits `json:"limits,omitempty"`

	// weight is the tenant's share of its tier under the pool's
	// spec.fairness mode Tokens: while backlogged, a tenant of weight 2 is
	// served twice the weighted tokens of one of weight 1. Ignored in mode
	// Requests.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=1
	// +optional
	Weight int32 `json:"weight,omitempty"`
}

// TenantQuotaStatus is the tenant's effective limits.
type TenantQuotaStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// effectiveConcurrencyLimit is the pool-wide in-flight cap in force.
	// +optional
	EffectiveConcurrencyLimit int32 `json:"effectiveConcurrencyLimit,omitempty"`

	// pool is the ModelPool of the tenant's tier.
	// +optional
	Pool string `json:"pool,omitempty"`

	// apiKeys is the number of API keys found in the Secret.
	// +optional
	APIKeys int32 `json:"apiKeys,omitempty"`

	// limits are the budgets in force, pool-wide, and where they come
	// from; absent when the tenant has none.
	// +optional
	Limits *LimitsStatus `json:"limits,omitempty"`

	// conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TenantQuotaReason is the Reason of a TenantQuota condition.
type TenantQuotaReason string

// TenantQuota condition reasons.
const (
	ReasonQuotaActive      TenantQuotaReason = "Active"
	ReasonTierNotFound     TenantQuotaReason = "TierNotFound"
	ReasonSecretNotFound   TenantQuotaReason = "SecretNotFound"
	ReasonSecretKeyMissing TenantQuotaReason = "SecretKeyMissing"
	ReasonDuplicateTenant  TenantQuotaReason = "DuplicateTenant"
	// ReasonSecretNotLabelled: the Secret exists but lacks APIKeysLabel,
	// so the controller does not read it and pushes none of its keys.
	ReasonSecretNotLabelled TenantQuotaReason = "SecretNotLabelled"
)

// APIKeysLabel marks the Secrets that hold API keys. The controller's
// cache holds only Secrets with this label set to "true".
const APIKeysLabel = "tiergate.dev/api-keys"

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tq,categories=tiergate
// +kubebuilder:printcolumn:name="TENANT",type=string,JSONPath=`.spec.tenant`
// +kubebuilder:printcolumn:name="TIER",type=string,JSONPath=`.spec.tierRef.name`
// +kubebuilder:printcolumn:name="LIMIT",type=integer,JSONPath=`.status.effectiveConcurrencyLimit`
// +kubebuilder:printcolumn:name="RPM",type=integer,JSONPath=`.status.limits.requestsPerMinute`
// +kubebuilder:printcolumn:name="TPM",type=integer,JSONPath=`.status.limits.tokensPerMinute`
// +kubebuilder:printcolumn:name="WEIGHT",type=integer,JSONPath=`.spec.weight`,priority=1
// +kubebuilder:printcolumn:name="READY",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`

// TenantQuota places one tenant in a tier, optionally with its own cap,
// API keys and budgets.
type TenantQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantQuotaSpec   `json:"spec"`
	Status TenantQuotaStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// TenantQuotaList is a list of TenantQuotas.
type TenantQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantQuota `json:"items"`
}
