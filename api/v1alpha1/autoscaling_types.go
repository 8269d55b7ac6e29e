package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
)

// Autoscaling is the KEDA ScaledObject the controller keeps for the model
// Deployment. Its trigger reads tiergate_pool_desired_replicas, which the
// controller computes from the offered load (status.desiredReplicas).
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="autoscaling.minReplicas must not exceed autoscaling.maxReplicas",fieldPath=".minReplicas"
type Autoscaling struct {
	// minReplicas is the fewest replicas KEDA keeps; 0 lets the pool scale
	// to zero (see spec.coldStart).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	// +optional
	MinReplicas int32 `json:"minReplicas"`

	// maxReplicas is the most replicas KEDA scales to.
	// +kubebuilder:validation:Minimum=1
	MaxReplicas int32 `json:"maxReplicas"`

	// targetUtilization is the fraction of the pool's slots the offered
	// load should keep busy, in (0, 1]. It is a quantity: write decimals
	// quoted ("0.8") or with a suffix (800m). A malformed quantity gets the
	// pattern's message only.
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || (quantity(string(self)).isGreaterThan(quantity('0')) && quantity(string(self)).compareTo(quantity('1')) <= 0)",message="autoscaling.targetUtilization must be greater than 0 and at most 1"
	// +kubebuilder:default="0.8"
	// +optional
	TargetUtilization *resource.Quantity `json:"targetUtilization,omitempty"`

	// prometheus is where KEDA reads the metric.
	// +optional
	Prometheus AutoscalingPrometheus `json:"prometheus,omitempty"`
}

// AutoscalingPrometheus is the Prometheus server that scrapes the
// controller's metrics and that KEDA queries.
type AutoscalingPrometheus struct {
	// serverAddress is the Prometheus HTTP API's base URL, such as
	// http://prometheus-operated.monitoring.svc:9090. Empty takes the
	// controller's --prometheus-address.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="autoscaling.prometheus.serverAddress must be an http or https URL, such as http://prometheus-operated.monitoring.svc:9090"
	// +optional
	ServerAddress string `json:"serverAddress,omitempty"`
}
