package controllers

import (
	"math"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// Hysteresis defaults for folding measured service times into S.
const (
	// defaultMeasuredMinCompletions is how many completions the dispatchers
	// must report in total before their service time is trusted.
	defaultMeasuredMinCompletions = 20
	// defaultMeasuredTolerance is the relative change below which the
	// measured service time is ignored, so bounds do not flap.
	defaultMeasuredTolerance = 0.10
)

// foldServiceTime combines the dispatchers' measured service times (each a
// mean over its own completions) into one, weighted by completions, and
// decides whether it replaces current. It moves only when at least
// minCompletions completions back it and it differs from current by more
// than tolerance (relative). The result is rounded to the millisecond.
// current 0 means nothing was recorded yet: any trusted measurement is taken.
func foldServiceTime(current time.Duration, stats []policy.Measured, minCompletions int64, tolerance float64) (time.Duration, bool) {
	var weighted float64
	var n int64
	for _, s := range stats {
		if s.Completed <= 0 || s.ServiceTimeSeconds <= 0 || math.IsNaN(s.ServiceTimeSeconds) || math.IsInf(s.ServiceTimeSeconds, 0) {
			continue
		}
		weighted += s.ServiceTimeSeconds * float64(s.Completed)
		n += s.Completed
	}
	if n == 0 || n < minCompletions {
		return current, false
	}
	measured := time.Duration(math.Round(weighted/float64(n)*1000)) * time.Millisecond
	if measured <= 0 {
		measured = time.Millisecond
	}
	if current > 0 && math.Abs(float64(measured-current)) <= tolerance*float64(current) {
		return current, false
	}
	return measured, measured != current
}

// foldTokenRate combines the dispatchers' measured weighted tokens per
// slot-second as foldServiceTime does the service times: weighted by
// completions (of the dispatchers that measured a rate), trusted from
// minCompletions on, moved only beyond tolerance, rounded to 0.001.
// current 0 takes any trusted measurement.
func foldTokenRate(current float64, stats []policy.Measured, minCompletions int64, tolerance float64) (float64, bool) {
	var weighted float64
	var n int64
	for _, s := range stats {
		if s.Completed <= 0 || s.TokensPerSlotSecond <= 0 || math.IsNaN(s.TokensPerSlotSecond) || math.IsInf(s.TokensPerSlotSecond, 0) {
			continue
		}
		weighted += s.TokensPerSlotSecond * float64(s.Completed)
		n += s.Completed
	}
	if n == 0 || n < minCompletions {
		return current, false
	}
	measured := max(math.Round(weighted/float64(n)*1000)/1000, 0.001)
	if current > 0 && math.Abs(measured-current) <= tolerance*current {
		return current, false
	}
	return measured, measured != current
}
