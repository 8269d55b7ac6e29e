package controllers

// versionBlock is how many policy versions one pool status write reserves.
// A scale step of many pods makes a version per pod event; 64 makes that
// one write per step or less, and a restart skips at most 63 versions.
const versionBlock = 64

// reserveVersions is the reserved ceiling that covers version, given the
// stored one, and whether it is new: a new ceiling must be stored, with the
// optimistic lock, before version is pushed, so that a restarted
// controller or a new leader, which starts above the stored ceiling, never
// pushes a version this one may have pushed.
func reserveVersions(stored, version int64) (ceiling int64, reserve bool) {
	if version <= stored {
		return stored, false
	}
	return version + versionBlock - 1, true
}
