package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestZeroScheduleFollowsTheDuration(t *testing.T) {
	tests := map[string]struct {
		main time.Duration
		want zeroSchedule
	}{
		// The short demo: the floors; the load lasts a cold start past the
		// scale to 6, while those pods start, and 4s more.
		"30s": {main: 30 * time.Second, want: zeroSchedule{ZeroAt: 3 * time.Second, UpAt: 3500 * time.Millisecond, FirstAt: 11500 * time.Millisecond,
			BackAt: 15500 * time.Millisecond, Load: 27500 * time.Millisecond, Grace: 15 * time.Second}},
		// The 3-minute demo: 15s lead, 12s on one replica, 15s back at 6.
		"3m": {main: 3 * time.Minute, want: zeroSchedule{ZeroAt: 15 * time.Second, UpAt: 15500 * time.Millisecond, FirstAt: 23500 * time.Millisecond,
			BackAt: 35500 * time.Millisecond, Load: 58500 * time.Millisecond, Grace: 15 * time.Second}},
		// An hour: the ceilings.
		"1h": {main: time.Hour, want: zeroSchedule{ZeroAt: 15 * time.Second, UpAt: 15500 * time.Millisecond, FirstAt: 23500 * time.Millisecond,
			BackAt: 35500 * time.Millisecond, Load: 58500 * time.Millisecond, Grace: 15 * time.Second}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := newZeroSchedule(tc.main)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if got.FirstAt-got.UpAt != zeroColdStart || got.UpAt-got.ZeroAt != zeroReaction {
				t.Errorf("scale to 1 %s after zero, the first replica due %s after that; want %s and the cold start %s",
					got.UpAt-got.ZeroAt, got.FirstAt-got.UpAt, zeroReaction, zeroColdStart)
			}
		})
	}
}

// Requests sent while held (here [3s, 11s)) are held, served, expired or
// refused by what their client got; the rest are not counted.
func TestSummarizeZeroTier(t *testing.T) {
	held := func(d time.Duration) bool { return d >= 3*time.Second && d < 11*time.Second }
	recs := []record{
		{Tier: "free", Start: sec(2), Outcome: outcomeServed},                          // before: not held
		{Tier: "free", Start: sec(4), Outcome: outcomeServed},                          // held, served
		{Tier: "free", Start: sec(5), Outcome: outcomeServed},                          // held, served
		{Tier: "free", Start: sec(6), Outcome: outcomeRefused, Cause: "queue_timeout"}, // held, expired
		{Tier: "free", Start: sec(7), Outcome: outcomeRefused, Cause: "capacity", RetryAfter: 3},
		{Tier: "free", Start: sec(8), Outcome: outcomeCut},     // held, cut
		{Tier: "free", Start: sec(12), Outcome: outcomeServed}, // after: not held
		{Tier: "premium", Start: sec(4), Outcome: outcomeRefused, Cause: "unavailable", RetryAfter: 8},
	}
	waits := []waitSample{
		{Tier: "free", Dispatch: sec(11.2), Wait: sec(7.2)}, // arrived at 4s
		{Tier: "free", Dispatch: sec(12), Wait: sec(7)},     // arrived at 5s
		{Tier: "free", Dispatch: sec(3), Wait: sec(1)},      // arrived at 2s: not held
	}
	samples := []sample{
		{OK: true, T: sec(2), Tiers: map[string]tierSample{"free": {Queued: 9}}},
		{OK: true, T: sec(6), Tiers: map[string]tierSample{"free": {Queued: 3}}},
		{OK: true, T: sec(9), Tiers: map[string]tierSample{"free": {Queued: 4}}},
	}
	got := summarizeZeroTier("free", recs, waits, samples, held, 11)
	want := zeroTier{Tier: "free", Sent: 5, Held: 4, Served: 2, Expired: 1, Refused: 1, RefusedByCause: map[string]int{"capacity": 1},
		PeakHeld: 4, WaitMin: 7, WaitP50: 7, WaitMax: 7.2, UntilReplica: 7}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("free (-want +got):\n%s", diff)
	}
	got = summarizeZeroTier("premium", recs, waits, samples, held, 11)
	want = zeroTier{Tier: "premium", Sent: 1, Refused: 1, RefusedByCause: map[string]int{"unavailable": 1}, RetryAfter: 8}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("premium (-want +got):\n%s", diff)
	}
	if w, want := zeroTierWords(zeroTier{Tier: "premium", Sent: 3, Refused: 3, RefusedByCause: map[string]int{"unavailable": 3}, RetryAfter: 8}, 8),
		"its bound at zero is 0 (it cannot wait out the 8s cold start): 3 of 3 requests sent while held got 503 unavailable at once, with Retry-After 8s."; w != want {
		t.Errorf("words %q, want %q", w, want)
	}
}
