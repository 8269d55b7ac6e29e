package baseline

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sched is what the tests drive; every scheduler here has these.
type sched interface {
	Enqueue(j *Job[string], now time.Duration) error
	Next(now time.Duration) *Job[string]
	Done(j *Job[string], now time.Duration)
	InFlight() int
	Queued(tier int) int
}

// step is one thing a test does at a time: enqueue a job (name, tenant,
// tier) or finish a running one, then run the loop's passes.
type step struct {
	at     time.Duration
	add    string // the job's name; "" for none
	tenant string
	tier   int
	done   string // the name of a running job that finishes
}

// play runs the steps and returns the names of the started jobs in order,
// and the names refused.
func play(t *testing.T, s sched, steps []step) (started, refused []string) {
	t.Helper()
	running := map[string]*Job[string]{}
	for _, st := range steps {
		if st.done != "" {
			j, ok := running[st.done]
			if !ok {
				t.Fatalf("at %s: %s is not running", st.at, st.done)
			}
			delete(running, st.done)
			s.Done(j, st.at)
		}
		if st.add != "" {
			j := &Job[string]{Value: st.add, Tenant: st.tenant, Tier: st.tier}
			if err := s.Enqueue(j, st.at); err != nil {
				if !errors.Is(err, ErrQueueFull) {
					t.Fatalf("Enqueue: %v", err)
				}
				refused = append(refused, st.add)
			}
		}
		for j := s.Next(st.at); j != nil; j = s.Next(st.at) {
			started = append(started, j.Value)
			running[j.Value] = j
		}
	}
	return started, refused
}

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func TestFCFS(t *testing.T) {
	s := NewFCFS[string](2)
	s.SetSlots(1)
	started, refused := play(t, s, []step{
		{at: 0, add: "a", tenant: "x", tier: 1},
		{at: 1, add: "b", tenant: "y", tier: 0}, // a better tier, but later
		{at: 2, add: "c", tenant: "x", tier: 1},
		{at: 3, done: "a"},
	})
	if diff := cmp.Diff([]string{"a", "b"}, started); diff != "" {
		t.Errorf("started (-want +got):\n%s", diff)
	}
	if refused != nil {
		t.Errorf("refused %v; FCFS refuses nothing", refused)
	}
	if s.Queued(1) != 1 || s.InFlight() != 1 || s.TenantInFlight("y") != 1 {
		t.Errorf("queued %d, in flight %d, y in flight %d; want 1, 1, 1", s.Queued(1), s.InFlight(), s.TenantInFlight("y"))
	}
	s.SetSlots(0)
	b := &Job[string]{Tenant: "y"}
	s.Done(b, 4)
	if j := s.Next(4); j != nil {
		t.Errorf("started %s with no slots", j.Value)
	}
}

func TestStrict(t *testing.T) {
	tests := map[string]struct {
		bases       []int
		bounds      []int
		steps       []step
		wantStarted []string
		wantRefused []string
	}{
		"the better band first, FIFO inside it": {
			bases: []int{0, 10}, bounds: []int{5, 5},
			steps: []step{
				{at: 0, add: "run", tenant: "x", tier: 1},
				{at: 1, add: "low1", tenant: "x", tier: 1},
				{at: 2, add: "hi1", tenant: "y", tier: 0},
				{at: 3, add: "hi2", tenant: "y", tier: 0},
				{at: 4, done: "run"},
				{at: 5, done: "hi1"},
				{at: 6, done: "hi2"},
			},
			wantStarted: []string{"run", "hi1", "hi2", "low1"},
		},
		"tiers of equal base share a band in arrival order, and no tenant is capped": {
			bases: []int{5, 5}, bounds: []int{5, 5},
			steps: []step{
				{at: 0, add: "run", tenant: "x", tier: 0},
				{at: 1, add: "b1", tenant: "x", tier: 1},
				{at: 2, add: "a1", tenant: "x", tier: 0},
				{at: 3, done: "run"},
				{at: 4, done: "b1"},
			},
			wantStarted: []string{"run", "b1", "a1"},
		},
		"a tier at its bound refuses": {
			bases: []int{0}, bounds: []int{1},
			steps: []step{
				{at: 0, add: "run", tenant: "x"},
				{at: 1, add: "q1", tenant: "x"},
				{at: 2, add: "q2", tenant: "y"},
			},
			wantStarted: []string{"run"},
			wantRefused: []string{"q2"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewStrict[string](tc.bases)
			s.SetLimits(1, tc.bounds, 0)
			started, refused := play(t, s, tc.steps)
			if diff := cmp.Diff(tc.wantStarted, started); diff != "" {
				t.Errorf("started (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantRefused, refused); diff != "" {
				t.Errorf("refused (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStrictRemoveAndExpire(t *testing.T) {
	s := NewStrict[string]([]int{0, 10})
	s.SetLimits(0, []int{10, 10}, 30*time.Second)
	if _, ok := s.NextDeadline(); ok {
		t.Error("a deadline with nothing queued")
	}
	jobs := map[string]*Job[string]{}
	for i, n := range []string{"a", "b", "c", "d"} {
		jobs[n] = &Job[string]{Value: n, Tenant: n, Tier: i % 2}
		if err := s.Enqueue(jobs[n], sec(float64(i))); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Remove(jobs["a"]) || s.Remove(jobs["a"]) {
		t.Error("Remove of a queued job must succeed once")
	}
	if dl, ok := s.NextDeadline(); !ok || dl != sec(31) {
		t.Errorf("next deadline %s %v, want 31s (b, queued at 1s)", dl, ok)
	}
	var names []string
	for _, j := range s.Expire(sec(32), nil) {
		names = append(names, j.Value)
	}
	// At 32s: b (1s) and c (2s) have waited 30s or more; d (3s) has not.
	// They come band by band.
	if diff := cmp.Diff([]string{"c", "b"}, names); diff != "" {
		t.Errorf("expired (-want +got):\n%s", diff)
	}
	if s.Queued(0) != 0 || s.Queued(1) != 1 {
		t.Errorf("queued %d, %d; want 0, 1", s.Queued(0), s.Queued(1))
	}
	s.SetLimits(1, []int{0, 0}, 0)
	if j := s.Next(sec(33)); j == nil || j.Value != "d" {
		t.Errorf("a lowered bound must not drop queued work: got %v", j)
	}
}

func TestSeedLimits(t *testing.T) {
	// The seed's worked example: P = 24, S = 6 s, so μ = 4/s.
	bounds, caps := SeedLimits(24, 6*time.Second, []time.Duration{5 * time.Second, 20 * time.Second, 60 * time.Second}, []float64{0.25, 0.10, 0.04})
	if diff := cmp.Diff([]int{20, 80, 240}, bounds); diff != "" {
		t.Errorf("bounds (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{6, 2, 1}, caps); diff != "" {
		t.Errorf("caps (-want +got):\n%s", diff)
	}
	// Floating point, as the seed computes: 100 × 0.29 is 28.999…, so 28.
	// A tiny pool still gets one of each.
	bounds, caps = SeedLimits(100, time.Second, []time.Duration{time.Millisecond}, []float64{0.29})
	if bounds[0] != 1 || caps[0] != 28 {
		t.Errorf("bound %d, cap %d; want 1, 28", bounds[0], caps[0])
	}
}

func seedTiers() []SeedTier {
	return []SeedTier{{Base: 0, Bound: 100, Cap: 100}, {Base: 20, Bound: 100, Cap: 100}}
}

// fill is n jobs of tenant p in tier at the same instant, named Aa, Ba, …
func fill(n int, at time.Duration, tier int) []step {
	var out []step
	for i := range n {
		out = append(out, step{at: at, add: string(rune('A'+i%26)) + string(rune('a'+i/26)), tenant: "p", tier: tier})
	}
	return out
}

func seq(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestSeedOrder checks the seed's ordering rules with premium (base 0) and
// free (base 20), ageing 1 s per point, one slot held by "run" from 0 s.
// The free job "free" is queued at 0 s.
func TestSeedOrder(t *testing.T) {
	start := []step{{at: 0, add: "run", tenant: "r", tier: 0}, {at: 0, add: "free", tenant: "f", tier: 1}}
	tests := map[string]struct {
		steps []step
		want  string // the job started at the last step
	}{
		// 16 queued: never rescored, so the free job, 25 s old and past
		// the 20 s horizon, stays behind fresh premium work.
		"16 queued are never rescored": {
			steps: seq(start, fill(15, sec(25), 0), []step{{at: sec(26), done: "run"}}),
			want:  "Aa",
		},
		// 17 queued: the passes rescore; at 26 s the free job's key is
		// 20 − 26 = −6, the premium jobs' 0 − 1 = −1.
		"17 queued are rescored": {
			steps: seq(start, fill(16, sec(25), 0), []step{{at: sec(26), done: "run"}}),
			want:  "free",
		},
		// Between rescores a key is as old as the last rescore, and a job
		// that arrived since keeps its base. 16 free jobs at 4.5 s make 17
		// queued: rescores at 4.5 s and then every second on the loop's
		// timer, the last at 19.5 s (free's key 20 − 19.5 = 0.5). A premium
		// job at 20.2 s enters with key 0 and runs first at 20.3 s, although
		// by then free's effective priority is −0.3 and the premium job's
		// −0.1.
		"between rescores the heap keeps stale keys": {
			steps: seq(start, fill(16, sec(4.5), 1), []step{{at: sec(20.2), add: "late", tenant: "p", tier: 0}, {at: sec(20.3), done: "run"}}),
			want:  "late",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewSeed[string](time.Second, seedTiers())
			s.SetLimits(1, []int{100, 100}, []int{100, 100})
			started, _ := play(t, s, tc.steps)
			if got := started[len(started)-1]; got != tc.want {
				t.Errorf("started %q after the last step, want %q (all started: %v)", got, tc.want, started)
			}
		})
	}
}

// TestSeedTimer counts rescores made by the loop's passes without events:
// every second while all slots are busy, on a 10 ms grid while every queued
// job is capped.
func TestSeedTimer(t *testing.T) {
	tests := map[string]struct {
		slots int
		// the 17 queued jobs' tenant: "r" is capped (it runs "run")
		tenant string
		// probe is when the last Next runs; the passes since 0.3 s are
		// counted
		probe time.Duration
		want  int
	}{
		// Rescore at 0 s; passes at 0.3 s (no: 0.3 s after it), then the
		// timer at 1.3 s and 2.3 s (yes, yes); the probe at 3.05 s is only
		// 0.75 s after the last.
		"at capacity: a pass a second after the last": {slots: 1, tenant: "p", probe: sec(3.05), want: 3},
		// Polling every 10 ms from 0.3 s: rescores at 1.0 s, 2.0 s and
		// 3.0 s.
		"all capped: a poll every 10 ms":         {slots: 2, tenant: "r", probe: sec(3.05), want: 4},
		"a probe at the instant of a timer pass": {slots: 1, tenant: "p", probe: sec(2.3), want: 3},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewSeed[string](time.Second, []SeedTier{{Base: 0}})
			s.SetLimits(tc.slots, []int{100}, []int{1})
			steps := []step{{at: 0, add: "run", tenant: "r"}}
			for i := range 17 {
				steps = append(steps, step{at: 0, add: string(rune('a' + i)), tenant: tc.tenant})
			}
			steps = append(steps, step{at: sec(0.3)}, step{at: tc.probe})
			started, _ := play(t, s, steps)
			if diff := cmp.Diff([]string{"run"}, started); diff != "" {
				t.Fatalf("started (-want +got):\n%s", diff)
			}
			if got := s.Rescores(); got != tc.want {
				t.Errorf("%d rescores, want %d", got, tc.want)
			}
		})
	}
}

// TestSeedCaps: capped jobs are popped and pushed back with their keys; a
// tier at its bound refuses.
func TestSeedCaps(t *testing.T) {
	s := NewSeed[string](time.Second, []SeedTier{{Base: 0}, {Base: 20}})
	s.SetLimits(2, []int{3, 1}, []int{1, 1})
	started, refused := play(t, s, []step{
		{at: 0, add: "h1", tenant: "hog", tier: 0},
		{at: 1, add: "h2", tenant: "hog", tier: 0},
		{at: 2, add: "h3", tenant: "hog", tier: 0},
		{at: 3, add: "o1", tenant: "other", tier: 1},
		{at: 4, add: "o2", tenant: "other2", tier: 1},
		{at: 4, add: "o3", tenant: "other3", tier: 1},
		{at: 5, add: "h4", tenant: "hog", tier: 0},
		{at: 6, done: "h1"},
	})
	if diff := cmp.Diff([]string{"h1", "o1", "h2"}, started); diff != "" {
		t.Errorf("started (-want +got):\n%s", diff)
	}
	// Bounds count queued jobs: premium 3 (h2, h3, h4), free 1 (o2 queued,
	// so o3 is refused).
	if diff := cmp.Diff([]string{"o3"}, refused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if s.Len() != 3 || s.Queued(0) != 2 || s.TenantInFlight("hog") != 1 || s.InFlight() != 2 {
		t.Errorf("queued %d (%d premium), hog in flight %d, in flight %d; want 3 (2), 1, 2", s.Len(), s.Queued(0), s.TenantInFlight("hog"), s.InFlight())
	}
}
