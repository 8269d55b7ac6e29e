// Package v1alpha1 holds the tiergate.dev/v1alpha1 API: ModelPool,
// ServiceTier and TenantQuota. Validation lives in the schema (OpenAPI bounds
// and CEL rules) so that kubectl apply refuses bad objects without a webhook.
//
// +kubebuilder:object:generate=true
// +groupName=tiergate.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "tiergate.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
