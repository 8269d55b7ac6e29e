// Package dispatcherside uses the policy wire type, as the controller side
// may, and reaches a dispatcher package through it; under the no-dispatcher
// rule hack/check-imports.sh must refuse it for the dispatcher package alone.
package dispatcherside

import (
	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// Tier and Stats are here only to use the imports.
var (
	Tier  policy.Tier
	Stats queue.Stats
)
