package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceTimeSource says where the mean service time S comes from.
// +kubebuilder:validation:Enum=Declared;Measured
type ServiceTimeSource string

const (
	// ServiceTimeDeclared uses spec.serviceTime.mean as it is.
	ServiceTimeDeclared ServiceTimeSource = "Declared"
	// ServiceTimeMeasured starts from mean and then follows what the
	// dispatchers measure.
	ServiceTimeMeasured ServiceTimeSource = "Measured"
)

// AuthenticationMode says how a dispatcher identifies a request's tenant.
// +kubebuilder:validation:Enum=TrustedHeader;APIKey;JWT
type AuthenticationMode string

const (
	// AuthTrustedHeader reads the tenant ID from a header set by a gateway.
	AuthTrustedHeader AuthenticationMode = "TrustedHeader"
	// AuthAPIKey maps a Bearer key to a tenant through hashed keys.
	AuthAPIKey AuthenticationMode = "APIKey"
	// AuthJWT verifies a Bearer JWT and reads the tenant from a claim.
	AuthJWT AuthenticationMode = "JWT"
)

// SharedStateMode says whether dispatchers share their counts.
// +kubebuilder:validation:Enum=Local;Redis
type SharedStateMode string

const (
	// SharedStateLocal gives each dispatcher its own slice of the pool.
	SharedStateLocal SharedStateMode = "Local"
	// SharedStateRedis gives every dispatcher the pool-wide numbers and
	// shares the counts through Redis.
	SharedStateRedis SharedStateMode = "Redis"
)

// ServiceTime is the mean time one request occupies one slot.
type ServiceTime struct {
	// mean service time of one request at full pool concurrency.
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) > duration('0s')",message="serviceTime.mean must be a duration greater than 0, such as 6s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	Mean metav1.Duration `json:"mean"`

	// source of the service time used for the bounds.
	// +kubebuilder:default=Declared
	// +optional
	Source ServiceTimeSource `json:"source,omitempty"`
}

// Ageing sets how fast a queued request gains priority. Exactly one of rate
// and starvationBound is set.
// +kubebuilder:validation:XValidation:rule="has(self.rate) != has(self.starvationBound)",message="ageing must set exactly one of rate and starvationBound"
type Ageing struct {
	// rate is the seconds of waiting worth one priority point.
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) > duration('0s')",message="ageing.rate must be a duration greater than 0, such as 6s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Rate *metav1.Duration `json:"rate,omitempty"`

	// starvationBound is the longest wait of the lowest tier behind the
	// highest; the rate is then bound / (max base - min base).
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) > duration('0s')",message="ageing.starvationBound must be a duration greater than 0, such as 120s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +optional
	StarvationBound *metav1.Duration `json:"starvationBound,omitempty"`
}

// Backend says how dispatchers reach the model pods.
type Backend struct {
	// port of the model server in each pod.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`

	// scheme used to reach the model server.
	// +kubebuilder:validation:Enum=http;https
	// +kubebuilder:default=http
	// +optional
	Scheme string `json:"scheme,omitempty"`
}

// Dispatchers selects this pool's dispatcher pods.
type Dispatchers struct {
	// selector of the dispatcher pods in the pool's namespace.
	Selector metav1.LabelSelector `json:"selector"`

	// adminPort is where a dispatcher accepts policy pushes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=9090
	// +optional
	AdminPort int32 `json:"adminPort,omitempty"`
}

// Authentication says how tenants are identified.
// +kubebuilder:validation:XValidation:rule="self.mode != 'TrustedHeader' || (has(self.headerName) && size(self.headerName) > 0)",message="authentication.headerName is required when authentication.mode is TrustedHeader",fieldPath=".headerName"
// +kubebuilder:validation:XValidation:rule="self.mode == 'TrustedHeader' || !has(self.trustedSources) || size(self.trustedSources) == 0",message="authentication.trustedSources applies only when authentication.mode is TrustedHeader",fieldPath=".trustedSources"
// +kubebuilder:validation:XValidation:rule="(self.mode == 'JWT') == has(self.jwt)",message="authentication.jwt is required when authentication.mode is JWT and allowed only then"
type Authentication struct {
	// mode is TrustedHeader, APIKey or JWT.
	// +kubebuilder:default=TrustedHeader
	// +optional
	Mode AuthenticationMode `json:"mode,omitempty"`

	// The pattern admits "" so that an empty name in TrustedHeader mode gets
	// the one message of the rule on Authentication, which names the mode.

	// headerName carries the tenant ID in TrustedHeader mode, where it is
	// required; ignored in APIKey mode.
	// +kubebuilder:default=X-Tenant-ID
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9-]*$`
	// +kubebuilder:validation:MaxLength=128
	// +optional
	HeaderName string `json:"headerName,omitempty"`

	// trustedSources, in TrustedHeader mode, are the CIDRs of the peers
	// (the gateway) whose tenant header is believed; a request from any
	// other TCP peer is refused. Empty believes every peer, and the pool
	// then carries the condition TenantHeaderUnprotected.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	TrustedSources []CIDR `json:"trustedSources,omitempty"`

	// jwt is the token check of JWT mode.
	// +optional
	JWT *JWTAuthentication `json:"jwt,omitempty"`
}

// ModelPoolSpec describes one pool of model replicas.
// +kubebuilder:validation:XValidation:rule="!has(self.tokens) || !has(self.tokens.boundBy) || self.tokens.boundBy != 'Tokens' || has(self.tokens.prefillTokensPerSecond) || (has(self.serviceTime.source) && self.serviceTime.source == 'Measured')",message="tokens.boundBy Tokens needs tokens.prefillTokensPerSecond and tokens.decodeTokensPerSecond, unless serviceTime.source is Measured",fieldPath=".tokens"
type ModelPoolSpec struct {
	// deploymentRef names the model Deployment in this namespace. Its
	// status.readyReplicas is the pool size.
	DeploymentRef LocalObjectReference `json:"deploymentRef"`

	// concurrencyPerReplica is the number of simultaneous generations one
	// replica sustains (vLLM's max-num-seqs).
	// +kubebuilder:validation:Minimum=1
	ConcurrencyPerReplica int32 `json:"concurrencyPerReplica"`

	// serviceTime is the mean time one request holds a slot.
	ServiceTime ServiceTime `json:"serviceTime"`

	// clientTimeout caps every tier's wait: no queue may imply a longer one.
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) >= duration('1s')",message="clientTimeout must be a duration of at least 1s, such as 30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ClientTimeout *metav1.Duration `json:"clientTimeout,omitempty"`

	// ageing sets how queued requests gain priority.
	// +kubebuilder:default={rate:"6s"}
	// +optional
	Ageing Ageing `json:"ageing,omitempty"`

	// backend says how dispatchers reach the model pods.
	Backend Backend `json:"backend"`

	// dispatchers selects the pods that receive this pool's policy.
	Dispatchers Dispatchers `json:"dispatchers"`

	// authentication says how tenants are identified.
	// +kubebuilder:default={mode:"TrustedHeader",headerName:"X-Tenant-ID"}
	// +optional
	Authentication Authentication `json:"authentication,omitempty"`

	// sharedState is Local (each dispatcher gets its slice) or Redis (every
	// dispatcher gets the pool-wide numbers and shares its counts).
	// +kubebuilder:default=Local
	// +optional
	SharedState SharedStateMode `json:"sharedState,omitempty"`

	// defaultTier is the tier of tenants with no TenantQuota. Empty refuses
	// them.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	DefaultTier string `json:"defaultTier,omitempty"`

	// exemptPaths are proxied without queueing.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:Pattern=`^/`
	// +listType=set
	// +optional
	ExemptPaths []string `json:"exemptPaths,omitempty"`

	// coldStart is how long a new replica of the model Deployment takes to
	// become Ready. With it, a pool at zero ready replicas holds requests
	// for the first replica instead of refusing them: its bounds are those
	// of one replica that starts serving after coldStart, and a tier whose
	// wait is shorter than coldStart is refused at once.
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) > duration('0s')",message="coldStart must be a duration greater than 0, such as 90s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ColdStart *metav1.Duration `json:"coldStart,omitempty"`

	// autoscaling makes the controller create and own a KEDA ScaledObject
	// that scales the model Deployment to status.desiredReplicas.
	// Removing it deletes the ScaledObject.
	// +optional
	Autoscaling *Autoscaling `json:"autoscaling,omitempty"`

	// tokens is how dispatchers count a request's tokens for the budgets
	// of ServiceTier spec.tenantLimits and TenantQuota spec.limits.
	// Absent, a request that names no maximum output reserves 1024.
	// +optional
	Tokens *Tokens `json:"tokens,omitempty"`

	// fairness is how the requests of one tier share its slots, and the
	// weights of a request's cost in tokens. Absent is mode Requests with
	// weights 1 and 2.
	// +optional
	Fairness *Fairness `json:"fairness,omitempty"`
}

// DispatcherCounts says how many dispatcher pods exist and hold the policy.
type DispatcherCounts struct {
	// total is the number of dispatcher pods with an IP.
	Total int32 `json:"total"`
	// ready is the number of Ready dispatcher pods.
	Ready int32 `json:"ready"`
	// synced is the number of dispatchers that acknowledged policyVersion.
	Synced int32 `json:"synced"`
}

// ModelPoolStatus is the pool as the controller last computed it.
type ModelPoolStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// readyReplicas is the Deployment's ready replica count R.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// poolConcurrency is R × concurrencyPerReplica.
	// +optional
	PoolConcurrency int32 `json:"poolConcurrency"`

	// serviceRate is poolConcurrency / S in requests per second, as a
	// decimal string.
	// +optional
	ServiceRate string `json:"serviceRate,omitempty"`

	// ageingRate is the waiting time worth one priority point.
	// +optional
	AgeingRate *metav1.Duration `json:"ageingRate,omitempty"`

	// observedServiceTime is the service time the dispatchers measured.
	// +optional
	ObservedServiceTime *metav1.Duration `json:"observedServiceTime,omitempty"`

	// observedTokenRate is the weighted tokens (spec.fairness's weights)
	// one slot serves per second, as the dispatchers measured it from
	// settled usage; a decimal string, absent until measured.
	// +optional
	ObservedTokenRate string `json:"observedTokenRate,omitempty"`

	// tokenRate is the weighted tokens per slot-second behind the tiers'
	// queueTokenBound: observedTokenRate when serviceTime.source is
	// Measured and it is known, else the rate spec.tokens declares.
	// Absent unless spec.tokens.boundBy is Tokens and a rate is known;
	// the queues are then bounded in requests.
	// +optional
	TokenRate string `json:"tokenRate,omitempty"`

	// dispatchers counts this pool's dispatcher pods.
	// +optional
	Dispatchers DispatcherCounts `json:"dispatchers"`

	// policyVersion is the version of the last computed policy. A new
	// version is pushed before it is written here, so this may lag what
	// the dispatchers hold by a moment (the controller's status delay).
	// +optional
	PolicyVersion int64 `json:"policyVersion,omitempty"`

	// policyVersionReserved is the highest version the controller may push
	// without writing this status first. It reserves versions in blocks,
	// written before the first of a block is pushed, so that a pod's
	// deletion reaches the dispatchers without a status write on its path,
	// and a restarted controller or a new leader starts above it: no
	// version is ever pushed twice with different content.
	// +kubebuilder:validation:Minimum=0
	// +optional
	PolicyVersionReserved int64 `json:"policyVersionReserved,omitempty"`

	// desiredReplicas is how many replicas the offered load needs by
	// Little's law: ceil(λ × S / (concurrencyPerReplica ×
	// targetUtilization)), with λ the requests per second the dispatchers
	// report (admitted plus refused for want of room), clamped to
	// spec.autoscaling's bounds when set, and at least 1 while any request
	// is queued or held.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas"`

	// conditions: Ready, Synced, Degraded, AgeingHorizonExceedsClientTimeout,
	// AutoscalerUnavailable, FewerSlotsThanDispatchers, DispatcherSkew,
	// TenantHeaderUnprotected (TrustedHeader mode) and JWKSReady (JWT mode).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ModelPool condition types.
const (
	ModelPoolSynced                            = "Synced"
	ModelPoolDegraded                          = "Degraded"
	ModelPoolAgeingHorizonExceedsClientTimeout = "AgeingHorizonExceedsClientTimeout"
	// ModelPoolAutoscalerUnavailable is True when spec.autoscaling is set
	// but its ScaledObject cannot be put in place.
	ModelPoolAutoscalerUnavailable = "AutoscalerUnavailable"

	// ModelPoolFewerSlotsThanDispatchers is True when, in Local mode, the
	// pool has fewer slots than healthy dispatchers: those left without a
	// slot report NotReady and serve nothing.
	ModelPoolFewerSlotsThanDispatchers = "FewerSlotsThanDispatchers"

	// ModelPoolDispatcherSkew is True while some dispatcher pods read an
	// older policy schema than the controller: it names them, and the
	// features in use they cannot enforce.
	ModelPoolDispatcherSkew = "DispatcherSkew"
)

// ModelPoolReason is the Reason of a ModelPool condition.
type ModelPoolReason string

// ModelPool condition reasons.
const (
	ReasonPoolReady             ModelPoolReason = "PoolReady"
	ReasonDeploymentNotFound    ModelPoolReason = "DeploymentNotFound"
	ReasonNoReadyReplicas       ModelPoolReason = "NoReadyReplicas"
	ReasonNoTiers               ModelPoolReason = "NoTiers"
	ReasonAllSynced             ModelPoolReason = "AllDispatchersSynced"
	ReasonSyncPending           ModelPoolReason = "SyncPending"
	ReasonNoDispatchers         ModelPoolReason = "NoDispatchers"
	ReasonPushUnauthorized      ModelPoolReason = "PushUnauthorized"
	ReasonPushRejected          ModelPoolReason = "PushRejected"
	ReasonDispatcherUnreachable ModelPoolReason = "DispatcherUnreachable"
	// ReasonDispatcherHeldByOtherPool: a dispatcher pod this pool selects
	// holds another ModelPool's policy (their selectors overlap).
	ReasonDispatcherHeldByOtherPool ModelPoolReason = "DispatcherHeldByOtherPool"
	ReasonHealthy                   ModelPoolReason = "Healthy"
	ReasonHorizonWithinTimeout      ModelPoolReason = "HorizonWithinClientTimeout"
	ReasonHorizonExceedsTimeout     ModelPoolReason = "HorizonExceedsClientTimeout"
	ReasonHeldForColdStart          ModelPoolReason = "HeldForColdStart"

	// Reasons of AutoscalerUnavailable.
	ReasonAutoscalingNotRequested ModelPoolReason = "AutoscalingNotRequested"
	ReasonScaledObjectInSync      ModelPoolReason = "ScaledObjectInSync"
	ReasonKEDANotInstalled        ModelPoolReason = "KEDANotInstalled"
	ReasonNoPrometheusAddress     ModelPoolReason = "NoPrometheusAddress"
	ReasonScaledObjectConflict    ModelPoolReason = "ScaledObjectNotOwned"
	ReasonScaledObjectWriteFailed ModelPoolReason = "ScaledObjectWriteFailed"

	// Reasons of FewerSlotsThanDispatchers.
	ReasonFewerSlotsThanDispatchers ModelPoolReason = "FewerSlotsThanDispatchers"
	ReasonDispatchersHoldSlots      ModelPoolReason = "DispatchersHoldSlots"

	// Reasons of DispatcherSkew.
	ReasonDispatchersCurrent  ModelPoolReason = "DispatchersCurrent"
	ReasonOlderDispatchers    ModelPoolReason = "OlderDispatchers"
	ReasonFeaturesNotEnforced ModelPoolReason = "FeaturesNotEnforced"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mp,categories=tiergate
// +kubebuilder:printcolumn:name="DEPLOYMENT",type=string,JSONPath=`.spec.deploymentRef.name`
// +kubebuilder:printcolumn:name="REPLICAS",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="DESIRED",type=integer,JSONPath=`.status.desiredReplicas`
// +kubebuilder:printcolumn:name="SLOTS",type=integer,JSONPath=`.status.poolConcurrency`
// +kubebuilder:printcolumn:name="RATE",type=string,JSONPath=`.status.serviceRate`
// +kubebuilder:printcolumn:name="FAIRNESS",type=string,JSONPath=`.spec.fairness.mode`,priority=1
// +kubebuilder:printcolumn:name="BOUND-BY",type=string,JSONPath=`.spec.tokens.boundBy`,priority=1
// +kubebuilder:printcolumn:name="TOKEN-RATE",type=string,JSONPath=`.status.tokenRate`,priority=1
// +kubebuilder:printcolumn:name="SYNCED",type=integer,JSONPath=`.status.dispatchers.synced`
// +kubebuilder:printcolumn:name="VERSION",type=integer,JSONPath=`.status.policyVersion`
// +kubebuilder:printcolumn:name="READY",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="AGE",type=date,JSONPath=`.metadata.creationTimestamp`

// ModelPool is one pool of model replicas behind tiergate dispatchers.
type ModelPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ModelPoolSpec   `json:"spec"`
	Status ModelPoolStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ModelPoolList is a list of ModelPools.
type ModelPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelPool `json:"items"`
}
