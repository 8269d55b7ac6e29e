// Package v1alpha1 holds the tiergate.dev/v1alpha1 API: ModelPool,
// ServiceTier and TenantQuota. Validation lives in the schema (OpenAPI bounds
// and CEL rules) so that kubectl apply refuses bad objects without a webhook.
// The package imports apimachinery only, so any client can use the types.
//
// +kubebuilder:object:generate=true
// +groupName=tiergate.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "tiergate.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&ModelPool{}, &ModelPoolList{},
		&ServiceTier{}, &ServiceTierList{},
		&TenantQuota{}, &TenantQuotaList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
