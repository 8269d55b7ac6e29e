package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CIDR is an IPv4 or IPv6 network such as 10.0.0.0/8, with no bits set
// beyond its prefix; a single address is written /32 or /128.
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.0.0/8 or fd00::/8 (a single address is 10.0.0.1/32)"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must have no bits set beyond its prefix length, such as 10.0.0.0/8 rather than 10.1.2.3/8"
type CIDR string

// JWTAuthentication checks a Bearer JWT: its signature with a key of the
// JWKS, exp and nbf (60s leeway), iss and aud; the tenant is the string
// value of tenantClaim.
type JWTAuthentication struct {
	// issuer must equal the token's iss claim.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Issuer string `json:"issuer"`

	// audiences: the token's aud claim must name one of them.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +listType=set
	Audiences []string `json:"audiences"`

	// tenantClaim names the claim whose string value is the tenant ID.
	// +kubebuilder:default=sub
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +optional
	TenantClaim string `json:"tenantClaim,omitempty"`

	// jwks is where the public keys come from.
	JWKS JWKSSource `json:"jwks"`
}

// JWKSSource is a JSON Web Key Set from exactly one of a Secret, a
// ConfigMap or an HTTPS URL. The controller reads or fetches it and pushes
// the public keys to the dispatchers inside their policy.
// +kubebuilder:validation:XValidation:rule="(has(self.secretRef) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) + (has(self.url) ? 1 : 0) == 1",message="jwt.jwks must set exactly one of secretRef, configMapRef and url"
// +kubebuilder:validation:XValidation:rule="!has(self.refreshInterval) || has(self.url)",message="jwt.jwks.refreshInterval applies only to a url",fieldPath=".refreshInterval"
type JWKSSource struct {
	// secretRef is a Secret of this namespace; it must carry the label
	// tiergate.dev/api-keys: "true", as the controller sees no other
	// Secret.
	// +optional
	SecretRef *JWKSKeyRef `json:"secretRef,omitempty"`

	// configMapRef is a ConfigMap of this namespace; it must carry the
	// label tiergate.dev/jwks: "true", as the controller sees no other
	// ConfigMap.
	// +optional
	ConfigMapRef *JWKSKeyRef `json:"configMapRef,omitempty"`

	// url is an https:// URL that serves the JWKS, such as an identity
	// provider's jwks_uri.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != ''",message="jwt.jwks.url must be an https:// URL with a host"
	// +optional
	URL string `json:"url,omitempty"`

	// refreshInterval is how often the url is fetched again (default
	// 10m); it is also fetched when a dispatcher sees a token whose key ID
	// it lacks.
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|ms|s|m|h))+)$') && duration(self) >= duration('1m')",message="jwt.jwks.refreshInterval must be a duration of at least 1m, such as 10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +optional
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`
}

// JWKSKeyRef names one key of a Secret or ConfigMap in the pool's
// namespace.
type JWKSKeyRef struct {
	// name of the Secret or ConfigMap.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key whose value is the JWKS document.
	// +kubebuilder:default=jwks.json
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
}

// LabelJWKS marks a ConfigMap that holds a pool's JWKS: the controller's
// cache holds only ConfigMaps labelled tiergate.dev/jwks: "true". (A JWKS
// Secret carries tiergate.dev/api-keys: "true", the one label that lets
// the controller see a Secret.)
const LabelJWKS = "tiergate.dev/jwks"

// ModelPool condition types of authentication.
const (
	// ModelPoolTenantHeaderUnprotected is True in TrustedHeader mode when
	// no trustedSources are set: any pod can then claim any tenant.
	ModelPoolTenantHeaderUnprotected = "TenantHeaderUnprotected"
	// ModelPoolJWKSReady is True in JWT mode when the JWKS was read and
	// its keys are in the policy.
	ModelPoolJWKSReady = "JWKSReady"
)

// ModelPool condition reasons of authentication.
const (
	ReasonNoTrustedSources  ModelPoolReason = "NoTrustedSources"
	ReasonTrustedSourcesSet ModelPoolReason = "TrustedSourcesSet"
	ReasonJWKSLoaded        ModelPoolReason = "JWKSLoaded"
	ReasonJWKSPending       ModelPoolReason = "JWKSPending"
	ReasonJWKSNotFound      ModelPoolReason = "JWKSNotFound"
	ReasonJWKSInvalid       ModelPoolReason = "JWKSInvalid"
	ReasonJWKSFetchFailed   ModelPoolReason = "JWKSFetchFailed"
)
