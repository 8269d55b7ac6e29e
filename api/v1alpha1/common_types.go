package v1alpha1

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// name of the referent.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// Condition types shared by the kinds of this group.
const (
	// ConditionReady is True when the object's computed values are in effect.
	ConditionReady = "Ready"
)
