// Package kubeclient uses the API types, as the capacity maths may, and
// reaches a Kubernetes client through controller-runtime; under the
// no-client rule hack/check-imports.sh must refuse it for the client alone.
package kubeclient

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// Pool and Object are here only to use the imports.
var (
	Pool   v1alpha1.ModelPool
	Object client.Object = &Pool
)
