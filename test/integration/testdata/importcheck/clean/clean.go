// Package clean uses only what the queue and the policy may use.
package clean

import (
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"
)

// Clock and Marshal are here only to use the imports.
var (
	Clock   clock.PassiveClock = clock.RealClock{}
	Marshal                    = yaml.Marshal
)
