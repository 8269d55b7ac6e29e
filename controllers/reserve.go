package controllers

import "time"

// versionBlock is how many policy versions one pool status write reserves.
// A scale step of many pods makes a version per pod event; 64 makes that
// one write per step or less, and a restart skips at most 63 versions.
const versionBlock = 64

// versionCeiling is the reserved ceiling that covers version, given the
// stored one. A ceiling above the stored one must be stored, with the
// optimistic lock, before version is pushed (PoolReconciler.reserveVersions),
// so that a restarted controller or a new leader, which starts above the
// stored ceiling, never pushes a version this one may have pushed.
func versionCeiling(stored, version int64) int64 {
	if version <= stored {
		return stored
	}
	return version + versionBlock - 1
}

// movingStatusDelay is how long a moving pool's status change (replicas on
// their way, see replicasMoving) may wait for its write: a scale-up's pods
// turn Ready over tens of seconds, each batch a version, and the status
// is for people. Once the pool settles the usual StatusDelay applies, so
// the settled status follows at once.
const movingStatusDelay = 5 * time.Second
