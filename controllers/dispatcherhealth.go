package controllers

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// In Local mode a failing dispatcher pod holds no share of the slots: the
// others get it, so no slot sits with a pod that cannot use it. A pod is
// failing when
//   - a container waits in CrashLoopBackOff;
//   - a container restarted within RestartWindow (its restart count rose,
//     or its last termination is that recent);
//   - it is NotReady after it had been Ready while holding slots; or
//   - it holds slots but has not become Ready within ReadyGrace.
//
// A dispatcher that holds no slot of a pool with backends reports NotReady
// by design, so readiness counts only while the pod holds slots: a pod
// given no share (fewer slots than dispatchers, or excluded) is never
// judged by the NotReady that share causes. Once excluded a pod stays out
// for a hold-down from the last time it was seen failing, doubling with
// each exclusion in a row (reset once it is Ready with its slots), so a
// pod whose readiness flaps loses and regains its share at most once per
// hold-down.

// healthTuning are the time constants of the rules above.
type healthTuning struct {
	RestartWindow, ReadyGrace, HoldDownBase, HoldDownMax time.Duration
}

var defaultHealthTuning = healthTuning{
	RestartWindow: 2 * time.Minute,
	ReadyGrace:    30 * time.Second,
	HoldDownBase:  30 * time.Second,
	HoldDownMax:   5 * time.Minute,
}

// dispatcherFacts is what one reconcile observes of a dispatcher pod.
type dispatcherFacts struct {
	UID          types.UID
	Name         string
	Ready        bool
	Restarts     int32
	CrashLooping bool
	// LastTerminated is the latest container termination, zero for none.
	LastTerminated time.Time
}

func factsOf(p *corev1.Pod) dispatcherFacts {
	f := dispatcherFacts{UID: p.UID, Name: p.Name, Ready: podReady(p), Restarts: podRestarts(p), CrashLooping: crashLooping(p)}
	for _, c := range p.Status.ContainerStatuses {
		if t := c.LastTerminationState.Terminated; t != nil && t.FinishedAt.After(f.LastTerminated) {
			f.LastTerminated = t.FinishedAt.Time
		}
	}
	return f
}

func crashLooping(p *corev1.Pod) bool {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			return true
		}
	}
	return false
}

// podHealth is what the reconciler remembers of one dispatcher pod.
type podHealth struct {
	restarts    int32
	restartedAt time.Time
	// shareSince is when the pod was last given slots after holding none;
	// zero while it holds none.
	shareSince time.Time
	// servedReady: it was seen Ready while holding slots.
	servedReady   bool
	excludedUntil time.Time
	// out is the last decision: excluded; strikes counts exclusions in a
	// row, reason is why the last one was made.
	out     bool
	strikes int
	reason  string
}

// healthMemory is a pool's memory of its dispatcher pods, by UID.
type healthMemory struct {
	pods map[types.UID]*podHealth
}

// assess returns, for each pod of facts in order, why it is excluded ("":
// it holds its share), the pods newly excluded, and the earliest time a
// decision may change with no new observation (zero: none). It updates the
// memory and forgets pods that are gone.
func (m *healthMemory) assess(facts []dispatcherFacts, now time.Time, tune healthTuning) (excluded []string, newly []string, next time.Time) {
	seen := make(map[types.UID]*podHealth, len(facts))
	excluded = make([]string, len(facts))
	for i, f := range facts {
		h := m.pods[f.UID]
		if h == nil {
			h = &podHealth{restarts: f.Restarts}
		}
		seen[f.UID] = h
		if reason := h.failing(f, now, tune); reason != "" {
			if !h.out {
				h.strikes++
				newly = append(newly, fmt.Sprintf("%s (%s)", f.Name, reason))
			}
			h.reason = reason
			h.excludedUntil = later(h.excludedUntil, now.Add(holdDown(h.strikes, tune)))
		}
		next = earliest(next, now, h.excludedUntil, h.restartedAt.Add(tune.RestartWindow))
		if h.out = now.Before(h.excludedUntil); h.out {
			excluded[i] = h.reason
		} else if !h.shareSince.IsZero() && !h.servedReady {
			next = earliest(next, now, h.shareSince.Add(tune.ReadyGrace))
		}
	}
	m.pods = seen
	return excluded, newly, next
}

// failing is why the pod is failing now, "" when it is not. It notes a
// restart and readiness with slots on the way.
func (h *podHealth) failing(f dispatcherFacts, now time.Time, tune healthTuning) string {
	if f.Restarts > h.restarts {
		h.restartedAt = now
	}
	h.restarts = f.Restarts
	h.restartedAt = later(h.restartedAt, f.LastTerminated)
	holds := !h.shareSince.IsZero()
	if f.Ready && holds {
		h.servedReady, h.strikes = true, 0
	}
	switch {
	case f.CrashLooping:
		return "CrashLoopBackOff"
	case !h.restartedAt.IsZero() && now.Sub(h.restartedAt) < tune.RestartWindow:
		return fmt.Sprintf("restarted within the last %s", tune.RestartWindow)
	case !f.Ready && holds && h.servedReady:
		return "NotReady after it had been Ready with its slots"
	case !f.Ready && holds && now.Sub(h.shareSince) >= tune.ReadyGrace:
		return fmt.Sprintf("not Ready within %s of getting its slots", tune.ReadyGrace)
	}
	return ""
}

// noteShares records the slots each target was given this reconcile; a
// pod given none is no longer judged by its readiness.
func (m *healthMemory) noteShares(targets []Target, now time.Time) {
	for _, t := range targets {
		h := m.pods[t.UID]
		if h == nil {
			continue
		}
		switch {
		case t.Policy.Slots == 0:
			h.shareSince, h.servedReady = time.Time{}, false
		case h.shareSince.IsZero():
			h.shareSince = now
		}
	}
}

func holdDown(strikes int, tune healthTuning) time.Duration {
	d := tune.HoldDownBase
	for i := 1; i < strikes && d < tune.HoldDownMax; i++ {
		d *= 2
	}
	return min(d, tune.HoldDownMax)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// earliest is the earliest of cur and the ts that are after now (zero
// times are ignored).
func earliest(cur, now time.Time, ts ...time.Time) time.Time {
	for _, t := range ts {
		if t.After(now) && (cur.IsZero() || t.Before(cur)) {
			cur = t
		}
	}
	return cur
}
