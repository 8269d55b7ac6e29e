package balancer

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// op is one step of a health script. At time at (since the start) it
// either ends a request on backend done with outcome (checking the Change)
// or picks (checking the backend and whether it is a probe) and ends the
// picked request with outcome unless hold keeps it outstanding.
type op struct {
	at      time.Duration
	done    string
	pick    string // the address Pick must return; "none" for no pick
	exclude string
	probe   bool
	hold    bool
	outcome Outcome
	want    Change
}

func failures(addr string, o Outcome, n int, at time.Duration) []op {
	out := make([]op, n)
	for i := range out {
		out[i] = op{at: at, done: addr, outcome: o}
	}
	return out
}

func script(parts ...[]op) []op {
	var out []op
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestHealth(t *testing.T) {
	sec := time.Second
	ejectedA := func(d time.Duration) []op { return []op{{done: "a:1", outcome: Failed, want: Change{Ejected: d}}} }
	refusedA := []op{{done: "a:1", outcome: Unreachable, want: Change{Ejected: sec}}}
	tests := map[string]struct {
		addrs  []string
		health Health
		ops    []op
		want   []Load
	}{
		"five 5xx in a row eject for the base time": {
			addrs: []string{"a:1", "b:1"},
			ops: script(failures("a:1", Failed, 4, 0), ejectedA(sec), []op{
				{pick: "b:1", outcome: Answered}, {pick: "b:1", outcome: Answered},
				{at: sec - 1, pick: "b:1", outcome: Answered},
			}),
			want: []Load{{Address: "a:1", Ejected: true, Ejections: 1}, {Address: "b:1"}},
		},
		"an answer breaks the run": {
			addrs: []string{"a:1", "b:1"},
			ops:   script(failures("a:1", Failed, 4, 0), []op{{done: "a:1", outcome: Answered}}, failures("a:1", Failed, 4, 0)),
			want:  []Load{{Address: "a:1", Failures: 4}, {Address: "b:1"}},
		},
		"a 4xx is an answer": {
			addrs: []string{"a:1", "b:1"},
			ops:   script(failures("a:1", Failed, 4, 0), failures("a:1", Answered, 1, 0), failures("a:1", Failed, 1, 0)),
			want:  []Load{{Address: "a:1", Failures: 1}, {Address: "b:1"}},
		},
		"a refused connection ejects at once": {
			addrs: []string{"a:1", "b:1"},
			ops:   []op{{done: "a:1", outcome: Unreachable, want: Change{Ejected: sec}}, {pick: "b:1", outcome: Answered}},
			want:  []Load{{Address: "a:1", Ejected: true, Ejections: 1}, {Address: "b:1"}},
		},
		"a connection dropped unanswered ejects at once": {
			addrs: []string{"a:1", "b:1"},
			ops:   []op{{done: "a:1", outcome: Dropped, want: Change{Ejected: sec}}, {pick: "b:1", outcome: Answered}},
			want:  []Load{{Address: "a:1", Ejected: true, Ejections: 1}, {Address: "b:1"}},
		},
		"dropped and refused connections are one run, 5xx answers another": {
			addrs:  []string{"a:1", "b:1"},
			health: Health{FailuresToEject: 3, UnreachableToEject: 2},
			ops: script(failures("a:1", Failed, 2, 0), failures("a:1", Dropped, 1, 0),
				[]op{{done: "a:1", outcome: Unreachable, want: Change{Ejected: sec}}}),
			want: []Load{{Address: "a:1", Ejected: true, Ejections: 1}, {Address: "b:1"}},
		},
		"the counts are configurable": {
			addrs:  []string{"a:1", "b:1"},
			health: Health{FailuresToEject: 2, UnreachableToEject: 3, BaseEjection: 5 * sec},
			ops: script(failures("a:1", Unreachable, 2, 0), []op{{done: "a:1", outcome: Unreachable, want: Change{Ejected: 5 * sec}}},
				failures("b:1", Failed, 1, 0), []op{{done: "b:1", outcome: Failed, want: Change{Spared: true}}}),
			want: []Load{{Address: "a:1", Ejected: true, Ejections: 1}, {Address: "b:1", Failures: 2}},
		},
		"the probe after the ejection restores on success": {
			addrs: []string{"a:1", "b:1"},
			ops: script(refusedA, []op{
				{pick: "b:1", hold: true}, // b now scores 1, a would score 0
				{at: sec, pick: "a:1", probe: true, outcome: Answered, want: Change{Restored: true}},
				{at: sec, pick: "a:1", outcome: Answered},
			}),
			want: []Load{{Address: "a:1", Ejections: 1}, {Address: "b:1", Outstanding: 1}},
		},
		"a probe that fails doubles the ejection, up to the cap": {
			addrs:  []string{"a:1", "b:1"},
			health: Health{MaxEjection: 5 * sec},
			ops: script(refusedA, []op{
				{pick: "b:1", hold: true},
				{at: sec, pick: "a:1", probe: true, outcome: Failed, want: Change{Ejected: 2 * sec}},
				{at: 3*sec - 1, pick: "b:1", outcome: Answered},
				{at: 3 * sec, pick: "a:1", probe: true, outcome: Unreachable, want: Change{Ejected: 4 * sec}},
				{at: 7 * sec, pick: "a:1", probe: true, outcome: Unreachable, want: Change{Ejected: 5 * sec}},
				{at: 12 * sec, pick: "a:1", probe: true, outcome: Unreachable, want: Change{Ejected: 5 * sec}},
			}),
			want: []Load{{Address: "a:1", Ejected: true, Ejections: 5}, {Address: "b:1", Outstanding: 1}},
		},
		"the back-off starts over after MaxEjection in service": {
			addrs:  []string{"a:1", "b:1"},
			health: Health{MaxEjection: 10 * sec},
			ops: script(refusedA, []op{
				{pick: "b:1", hold: true},
				{at: sec, pick: "a:1", probe: true, outcome: Unreachable, want: Change{Ejected: 2 * sec}},
				{at: 3 * sec, pick: "a:1", probe: true, outcome: Answered, want: Change{Restored: true}},
				{at: 9 * sec, pick: "a:1", outcome: Unreachable, want: Change{Ejected: 4 * sec}}, // too soon: doubled
				{at: 13 * sec, pick: "a:1", probe: true, outcome: Answered, want: Change{Restored: true}},
				{at: 23 * sec, pick: "a:1", outcome: Answered}, // 10s in service: forgotten
				{at: 23 * sec, pick: "a:1", outcome: Unreachable, want: Change{Ejected: sec}},
			}),
			want: []Load{{Address: "a:1", Ejected: true, Ejections: 4}, {Address: "b:1", Outstanding: 1}},
		},
		"the last backend in service is spared": {
			addrs: []string{"a:1"},
			ops: script(failures("a:1", Failed, 4, 0), []op{
				{done: "a:1", outcome: Failed, want: Change{Spared: true}},
				{pick: "a:1", outcome: Unreachable, want: Change{Spared: true}},
			}),
			want: []Load{{Address: "a:1", Failures: 6}},
		},
		"a second ejection that would leave none is spared": {
			addrs: []string{"a:1", "b:1"},
			ops: []op{
				{done: "a:1", outcome: Unreachable, want: Change{Ejected: sec}},
				{done: "b:1", outcome: Unreachable, want: Change{Spared: true}},
				{pick: "b:1", outcome: Answered},
			},
			want: []Load{{Address: "a:1", Ejected: true, Ejections: 1}, {Address: "b:1"}},
		},
		"failures count into the score": {
			addrs: []string{"a:1", "b:1"},
			ops: script(failures("a:1", Failed, 2, 0), []op{
				{pick: "b:1", hold: true}, // b scores 0, a scores 2
				{pick: "b:1", hold: true}, // b scores 1
			}),
			want: []Load{{Address: "a:1", Failures: 2}, {Address: "b:1", Outstanding: 2}},
		},
		"a retry excludes the backend that failed": {
			addrs: []string{"a:1", "b:1"},
			ops: []op{
				{pick: "b:1", exclude: "a:1", hold: true},
				{pick: "b:1", exclude: "a:1", hold: true},
			},
			want: []Load{{Address: "a:1"}, {Address: "b:1", Outstanding: 2}},
		},
		"a retry with no other backend has none": {
			addrs: []string{"a:1"},
			ops:   []op{{pick: "none", exclude: "a:1"}},
			want:  []Load{{Address: "a:1"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { runScript(t, tc.addrs, tc.health, tc.ops, tc.want) })
	}
}

func runScript(t *testing.T, addrs []string, h Health, ops []op, want []Load) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	b := New(h, clk)
	b.Update(backends(addrs...))
	by := map[string]*Backend{}
	for _, be := range *b.set.Load() {
		by[be.Address] = be
	}
	for i, o := range ops {
		clk.SetTime(t0.Add(o.at))
		if o.done != "" {
			be := by[o.done]
			be.outstanding.Add(1) // a request picked earlier
			if got := b.Done(Picked{Backend: be}, o.outcome); got != o.want {
				t.Fatalf("op %d: Done(%s, %d) = %+v, want %+v", i, o.done, o.outcome, got, o.want)
			}
			continue
		}
		p, ok := b.Pick(by[o.exclude])
		if o.pick == "none" {
			if ok {
				t.Fatalf("op %d: picked %s, want none", i, p.Address)
			}
			continue
		}
		if !ok || p.Address != o.pick || p.probe != o.probe {
			t.Fatalf("op %d: picked %+v (ok %v, probe %v), want %s (probe %v)", i, p.Backend, ok, p.probe, o.pick, o.probe)
		}
		if o.hold {
			continue
		}
		if got := b.Done(p, o.outcome); got != o.want {
			t.Fatalf("op %d: Done(%s, %d) = %+v, want %+v", i, o.pick, o.outcome, got, o.want)
		}
	}
	if diff := cmp.Diff(want, b.Snapshot()); diff != "" {
		t.Errorf("backends (-want +got)\n%s", diff)
	}
}

// Every backend ejected (the set changed under the ejections): the one
// whose ejection ends first serves, before its probe is due.
func TestAllEjectedUsesLeastBad(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	b := New(Health{}, clk)
	b.Update(backends("a:1", "b:1", "c:1"))
	set := *b.set.Load()
	b.Done(pickedFor(set[0]), Unreachable) // a: 1s
	clk.Step(500 * time.Millisecond)
	b.Done(pickedFor(set[1]), Unreachable) // b: until 1.5s
	b.Update(backends("a:1", "b:1"))
	p, ok := b.Pick(nil)
	if !ok || p.Address != "a:1" || p.probe {
		t.Fatalf("picked %+v probe %v, want a:1 (no probe yet)", p.Backend, p.probe)
	}
	b.Done(p, Unknown)
	if p, _ := b.Pick(set[0]); p.Address != "b:1" {
		t.Fatalf("retry picked %s, want b:1", p.Address)
	}
}

// A half-open backend gets one probe at a time; a probe whose client left
// says nothing, so the next request probes again.
func TestOneProbeAtATime(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	b := New(Health{}, clk)
	b.Update(backends("a:1", "b:1"))
	set := *b.set.Load()
	b.Done(pickedFor(set[0]), Unreachable)
	held := pickedFor(set[1]) // b scores 1, a would score 0
	clk.Step(time.Second)
	probe, _ := b.Pick(nil)
	if probe.Address != "a:1" || !probe.probe {
		t.Fatalf("picked %s probe %v, want the probe of a:1", probe.Address, probe.probe)
	}
	if p, _ := b.Pick(nil); p.Address != "b:1" {
		t.Fatalf("picked %s while a:1's probe is out, want b:1", p.Address)
	} else {
		b.Done(p, Answered)
	}
	if got := b.Done(probe, Unknown); got != (Change{}) {
		t.Fatalf("Done(probe, Unknown) = %+v", got)
	}
	again, _ := b.Pick(nil)
	if again.Address != "a:1" || !again.probe {
		t.Fatalf("picked %s probe %v after the probe's client left, want a new probe of a:1", again.Address, again.probe)
	}
	if got := b.Done(again, Answered); got != (Change{Restored: true}) {
		t.Fatalf("Done(probe, Answered) = %+v, want restored", got)
	}
	b.Done(held, Answered)
	want := []Load{{Address: "a:1", Ejections: 1}, {Address: "b:1"}}
	if diff := cmp.Diff(want, b.Snapshot()); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func pickedFor(be *Backend) Picked {
	be.outstanding.Add(1)
	return Picked{Backend: be}
}

func TestHealthFlags(t *testing.T) {
	tests := map[string]struct {
		args    []string
		want    Health
		wantErr string
	}{
		"defaults": {want: Health{FailuresToEject: 5, UnreachableToEject: 1, BaseEjection: time.Second, MaxEjection: 30 * time.Second}},
		"set": {args: []string{"--backend-eject-after-failures", "3", "--backend-eject-after-unreachable", "2", "--backend-ejection-base", "2s", "--backend-ejection-max", "1m"},
			want: Health{FailuresToEject: 3, UnreachableToEject: 2, BaseEjection: 2 * time.Second, MaxEjection: time.Minute}},
		"negative count": {args: []string{"--backend-eject-after-failures", "-1"}, wantErr: "--backend-eject-after-failures and --backend-eject-after-unreachable must be >= 1, got -1 and 1"},
		"base over max":  {args: []string{"--backend-ejection-base", "1m"}, wantErr: "--backend-ejection-base 1m0s must be > 0 and at most --backend-ejection-max 30s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			var h Health
			AddFlags(fs, &h)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := h.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, h); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}
