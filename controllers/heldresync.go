package controllers

import (
	"time"

	"github.com/tiergate/tiergate/capacity"
)

// heldResyncPeriod caps the resync period while the pool is at zero
// replicas and holds requests for its first replica. The dispatchers'
// offered load and held count come back only in the acks of pushes, so a
// held request reaches status.desiredReplicas (and the autoscaler reading
// it) up to one resync late, and at zero that delay adds to the cold
// start. Re-pushing an unchanged policy costs one PUT per dispatcher.
const heldResyncPeriod = 5 * time.Second

// resyncPeriod is the pool's resync period: the configured one, at most
// heldResyncPeriod while held. 0 (no resync) stays 0.
func resyncPeriod(configured time.Duration, b capacity.Bounds) time.Duration {
	if b.Pool.ColdStart > 0 && configured > heldResyncPeriod {
		return heldResyncPeriod
	}
	return configured
}
