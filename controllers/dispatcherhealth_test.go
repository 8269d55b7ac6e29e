package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

var testTuning = healthTuning{RestartWindow: time.Minute, ReadyGrace: 10 * time.Second, HoldDownBase: 20 * time.Second, HoldDownMax: 80 * time.Second}

// healthStep is one reconcile of the health rules: at offset At the pods
// look like Facts; the reconcile then gives each the slots in Shares.
type healthStep struct {
	At     time.Duration
	Facts  []dispatcherFacts
	Shares []int
	// want
	Excluded []string
	Newly    []string
	Next     time.Duration // 0: none
}

func pod(name string, ready bool) dispatcherFacts {
	return dispatcherFacts{UID: types.UID("uid-" + name), Name: name, Ready: ready}
}

func restarted(f dispatcherFacts, n int32) dispatcherFacts { f.Restarts = n; return f }

func looping(f dispatcherFacts) dispatcherFacts { f.CrashLooping = true; return f }

func terminated(f dispatcherFacts, at time.Time) dispatcherFacts { f.LastTerminated = at; return f }

func TestDispatcherHealth(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const restartMsg, lostMsg, graceMsg = "restarted within the last 1m0s", "NotReady after it had been Ready with its slots", "not Ready within 10s of getting its slots"
	for name, steps := range map[string][]healthStep{
		"fewer slots than dispatchers: the slot-less one is NotReady and that is no failure": {
			{Facts: []dispatcherFacts{pod("a", false), pod("b", false), pod("c", false)}, Shares: []int{1, 1, 0}, Excluded: []string{"", "", ""}},
			{At: time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", true), pod("c", false)}, Shares: []int{1, 1, 0}, Excluded: []string{"", "", ""}},
			{At: time.Hour, Facts: []dispatcherFacts{pod("a", true), pod("b", true), pod("c", false)}, Shares: []int{1, 1, 0}, Excluded: []string{"", "", ""}},
		},
		"a pod that gets slots after holding none has the grace period to become Ready": {
			{Facts: []dispatcherFacts{pod("a", true), pod("c", false)}, Shares: []int{1, 0}, Excluded: []string{"", ""}},
			{At: time.Second, Facts: []dispatcherFacts{pod("a", true), pod("c", false)}, Shares: []int{1, 1}, Excluded: []string{"", ""}},
			// Its Ready condition lags the push: not failing yet.
			{At: 5 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("c", false)}, Shares: []int{1, 1}, Excluded: []string{"", ""}, Next: 11 * time.Second},
			{At: 6 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("c", true)}, Shares: []int{1, 1}, Excluded: []string{"", ""}},
		},
		"NotReady after Ready with its slots: excluded for the hold-down, then back": {
			{Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: 2 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{24, 0},
				Excluded: []string{"", lostMsg}, Newly: []string{"b (" + lostMsg + ")"}, Next: 22 * time.Second},
			// Holding no slot, its NotReady is its own share's doing: it
			// stays out only for the hold-down.
			{At: 10 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{24, 0}, Excluded: []string{"", lostMsg}, Next: 22 * time.Second},
			{At: 22 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: 23 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
		},
		"a pod that never becomes Ready with its slots: out after the grace, hold-downs doubling": {
			{Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{12, 12}, Excluded: []string{"", ""}, Next: 0},
			{At: 10 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{24, 0},
				Excluded: []string{"", graceMsg}, Newly: []string{"b (" + graceMsg + ")"}, Next: 30 * time.Second},
			{At: 30 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: 40 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{24, 0},
				Excluded: []string{"", graceMsg}, Newly: []string{"b (" + graceMsg + ")"}, Next: 80 * time.Second},
			{At: 80 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			// Ready at last: the strikes are forgotten.
			{At: 81 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: 90 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{24, 0},
				Excluded: []string{"", lostMsg}, Newly: []string{"b (" + lostMsg + ")"}, Next: 110 * time.Second},
		},
		"a crash loop: out while it lasts and through the restart window, held from the last sight of either": {
			{Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: time.Second, Facts: []dispatcherFacts{pod("a", true), looping(restarted(pod("b", false), 3))}, Shares: []int{24, 0},
				Excluded: []string{"", "CrashLoopBackOff"}, Newly: []string{"b (CrashLoopBackOff)"}, Next: 21 * time.Second},
			{At: 50 * time.Second, Facts: []dispatcherFacts{pod("a", true), looping(restarted(pod("b", false), 3))}, Shares: []int{24, 0},
				Excluded: []string{"", "CrashLoopBackOff"}, Next: 61 * time.Second},
			// Running again, restart count 4: the restart window starts now.
			{At: 55 * time.Second, Facts: []dispatcherFacts{pod("a", true), restarted(pod("b", true), 4)}, Shares: []int{24, 0},
				Excluded: []string{"", restartMsg}, Next: 75 * time.Second},
			// Seen failing at the hold-down's end: held again.
			{At: 75 * time.Second, Facts: []dispatcherFacts{pod("a", true), restarted(pod("b", true), 4)}, Shares: []int{24, 0},
				Excluded: []string{"", restartMsg}, Next: 95 * time.Second},
			{At: 95 * time.Second, Facts: []dispatcherFacts{pod("a", true), restarted(pod("b", true), 4)}, Shares: []int{24, 0},
				Excluded: []string{"", restartMsg}, Next: 115 * time.Second},
			// The window is over and so is the hold-down from its last sight.
			{At: 115 * time.Second, Facts: []dispatcherFacts{pod("a", true), restarted(pod("b", true), 4)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: 116 * time.Second, Facts: []dispatcherFacts{pod("a", true), restarted(pod("b", true), 4)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
		},
		"a restart seen first in the container's last termination (a controller that restarted)": {
			{At: 30 * time.Second, Facts: []dispatcherFacts{pod("a", true), terminated(restarted(pod("b", true), 1), t0.Add(20*time.Second))}, Shares: []int{24, 0},
				Excluded: []string{"", restartMsg}, Newly: []string{"b (" + restartMsg + ")"}, Next: 50 * time.Second},
		},
		"an old restart counts for nothing": {
			{At: time.Hour, Facts: []dispatcherFacts{pod("a", true), terminated(restarted(pod("b", true), 7), t0)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
		},
		"a pod that goes away is forgotten; back under the same name it is new": {
			{Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", true)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
			{At: 2 * time.Second, Facts: []dispatcherFacts{pod("a", true)}, Shares: []int{24}, Excluded: []string{""}},
			{At: 3 * time.Second, Facts: []dispatcherFacts{pod("a", true), pod("b", false)}, Shares: []int{12, 12}, Excluded: []string{"", ""}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var m healthMemory
			for i, s := range steps {
				now := t0.Add(s.At)
				excluded, newly, next := m.assess(s.Facts, now, testTuning)
				var nextOff time.Duration
				if !next.IsZero() {
					nextOff = next.Sub(t0)
				}
				type out struct {
					Excluded, Newly []string
					Next            time.Duration
				}
				if diff := cmp.Diff(out{s.Excluded, s.Newly, s.Next}, out{excluded, newly, nextOff}, cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("step %d at +%s (-want +got):\n%s", i, s.At, diff)
				}
				var targets []Target
				for j, f := range s.Facts {
					targets = append(targets, Target{UID: f.UID, Name: f.Name, Policy: policy.Policy{Slots: s.Shares[j]}})
				}
				m.noteShares(targets, now)
			}
		})
	}
}

func TestHoldDown(t *testing.T) {
	var got []time.Duration
	for s := 1; s <= 5; s++ {
		got = append(got, holdDown(s, testTuning))
	}
	if diff := cmp.Diff([]time.Duration{20 * time.Second, 40 * time.Second, 80 * time.Second, 80 * time.Second, 80 * time.Second}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
