package capacity

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// The ModelPool defaults of the CRD (the +kubebuilder:default markers in
// api/v1alpha1), for objects that were never defaulted by an API server.
// spec.tokens.defaultMaxTokens defaults to policy.DefaultMaxTokens, the
// dispatchers' own default, when spec.tokens is given, and spec.fairness's
// weights to policy.DefaultInputWeight and DefaultOutputWeight.
const (
	// DefaultAgeingRate is the rate of an ageing that sets neither rate
	// nor starvationBound.
	DefaultAgeingRate = 6 * time.Second
	// DefaultTargetUtilization is spec.autoscaling.targetUtilization's
	// default, as a quantity.
	DefaultTargetUtilization = "0.8"

	defaultTenantHeader  = "X-Tenant-ID"
	defaultTenantClaim   = "sub"
	defaultJWKSKey       = "jwks.json"
	defaultBackendScheme = "http"
	defaultAdminPort     = 9090
)

// ApplyDefaults sets the fields of spec that the CRD defaults and that are
// unset. On an object read from the API server it changes nothing. It never
// writes through a pointer of spec, so a shallow copy of a spec can be
// defaulted without touching the original.
//
// spec.ageing is left alone: the CRD defaults it only when it is absent,
// and a decoded value cannot tell an absent ageing from `ageing: {}`,
// which the schema refuses. A caller that can tell sets Rate to
// DefaultAgeingRate itself; ComputeBounds reads an ageing with neither
// field set as DefaultAgeingRate.
func ApplyDefaults(spec *v1alpha1.ModelPoolSpec) {
	if spec.ServiceTime.Source == "" {
		spec.ServiceTime.Source = v1alpha1.ServiceTimeDeclared
	}
	if spec.Authentication.Mode == "" {
		spec.Authentication.Mode = v1alpha1.AuthTrustedHeader
	}
	if spec.Authentication.HeaderName == "" {
		spec.Authentication.HeaderName = defaultTenantHeader
	}
	applyJWTDefaults(spec.Authentication.JWT)
	if spec.SharedState == "" {
		spec.SharedState = v1alpha1.SharedStateLocal
	}
	if spec.Backend.Scheme == "" {
		spec.Backend.Scheme = defaultBackendScheme
	}
	if spec.Dispatchers.AdminPort == 0 {
		spec.Dispatchers.AdminPort = defaultAdminPort
	}
	if t := spec.Tokens; t != nil && (t.DefaultMaxTokens == 0 || t.BoundBy == "") {
		// A copy, as for Autoscaling below.
		c := *t
		if c.DefaultMaxTokens == 0 {
			c.DefaultMaxTokens = policy.DefaultMaxTokens
		}
		if c.BoundBy == "" {
			c.BoundBy = v1alpha1.BoundByRequests
		}
		spec.Tokens = &c
	}
	if f := spec.Fairness; f != nil && (f.Mode == "" || f.InputWeight == 0 || f.OutputWeight == 0) {
		c := *f
		if c.Mode == "" {
			c.Mode = v1alpha1.FairnessRequests
		}
		if c.InputWeight == 0 {
			c.InputWeight = policy.DefaultInputWeight
		}
		if c.OutputWeight == 0 {
			c.OutputWeight = policy.DefaultOutputWeight
		}
		spec.Fairness = &c
	}
	if a := spec.Autoscaling; a != nil && a.TargetUtilization == nil {
		// A new Autoscaling, so the caller's object is not written through
		// the shared pointer.
		c := *a
		u := resource.MustParse(DefaultTargetUtilization)
		c.TargetUtilization = &u
		spec.Autoscaling = &c
	}
}

func applyJWTDefaults(j *v1alpha1.JWTAuthentication) {
	if j == nil {
		return
	}
	if j.TenantClaim == "" {
		j.TenantClaim = defaultTenantClaim
	}
	for _, ref := range []*v1alpha1.JWKSKeyRef{j.JWKS.SecretRef, j.JWKS.ConfigMapRef} {
		if ref != nil && ref.Key == "" {
			ref.Key = defaultJWKSKey
		}
	}
}
