package balancer

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func backends(addrs ...string) []policy.Backend {
	out := make([]policy.Backend, len(addrs))
	for i, a := range addrs {
		out[i] = policy.Backend{Address: a}
	}
	return out
}

func TestPickLeastOutstanding(t *testing.T) {
	tests := map[string]struct {
		addrs []string
		// hold[i] requests are kept outstanding on addrs[i] before the pick.
		hold []int
		want string
	}{
		"idle one wins":       {addrs: []string{"a:1", "b:1", "c:1"}, hold: []int{2, 0, 1}, want: "b:1"},
		"least loaded wins":   {addrs: []string{"a:1", "b:1", "c:1"}, hold: []int{3, 2, 1}, want: "c:1"},
		"single backend":      {addrs: []string{"a:1"}, hold: []int{5}, want: "a:1"},
		"only one not at tie": {addrs: []string{"a:1", "b:1"}, hold: []int{1, 4}, want: "a:1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := New(Health{}, nil)
			b.Update(backends(tc.addrs...))
			set := *b.set.Load()
			for i, n := range tc.hold {
				set[i].outstanding.Store(int64(n))
			}
			got, ok := b.Pick(nil)
			if !ok {
				t.Fatal("no pick")
			}
			if got.Address != tc.want {
				t.Errorf("picked %s, want %s", got.Address, tc.want)
			}
		})
	}
}

// With equal load, picks spread round-robin; Done returns counts to zero.
func TestPickSpreadsAndDone(t *testing.T) {
	b := New(Health{}, nil)
	b.Update(backends("a:1", "b:1", "c:1"))
	var picked []Picked
	for range 6 {
		be, _ := b.Pick(nil)
		picked = append(picked, be)
	}
	want := []Load{{Address: "a:1", Outstanding: 2}, {Address: "b:1", Outstanding: 2}, {Address: "c:1", Outstanding: 2}}
	if diff := cmp.Diff(want, b.Snapshot()); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	for _, be := range picked {
		b.Done(be, Answered)
	}
	want = []Load{{Address: "a:1"}, {Address: "b:1"}, {Address: "c:1"}}
	if diff := cmp.Diff(want, b.Snapshot()); diff != "" {
		t.Errorf("after Done (-want +got)\n%s", diff)
	}
}

func TestUpdateKeepsCounts(t *testing.T) {
	b := New(Health{}, nil)
	if _, ok := b.Pick(nil); ok {
		t.Fatal("picked from an empty set")
	}
	b.Update(backends("a:1", "b:1"))
	held, _ := b.Pick(nil) // one of them now has 1
	b.Update([]policy.Backend{{Address: held.Address}, {Address: "c:1", Scheme: "https"}})
	got := map[string]int64{}
	for _, l := range b.Snapshot() {
		got[l.Address] = l.Outstanding
	}
	want := map[string]int64{held.Address: 1, "c:1": 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	be, _ := b.Pick(nil)
	if be.Address != "c:1" || be.URL.String() != "https://c:1" {
		t.Errorf("picked %s (%s), want the idle https backend", be.Address, be.URL)
	}
	b.Done(held, Answered)
	b.Done(be, Answered)
}

// A backend removed while it runs requests and then added back keeps
// counting them; one removed idle is forgotten.
func TestRemovedAndBackKeepsItsCount(t *testing.T) {
	b := New(Health{}, nil)
	b.Update(backends("a:1", "b:1"))
	set := *b.set.Load()
	a := Picked{Backend: set[0]}
	a.outstanding.Add(2)
	b.Update(backends("b:1"))
	b.Update(backends("a:1", "b:1"))
	want := []Load{{Address: "a:1", Outstanding: 2}, {Address: "b:1"}}
	if diff := cmp.Diff(want, b.Snapshot()); diff != "" {
		t.Errorf("back again (-want +got)\n%s", diff)
	}
	if (*b.set.Load())[0] != a.Backend {
		t.Error("a:1 came back as a new record")
	}
	b.Update(backends("b:1"))
	b.Done(a, Answered)
	b.Done(a, Answered)
	b.Update(backends("c:1"))
	b.Update(backends("a:1"))
	if diff := cmp.Diff([]Load{{Address: "a:1"}}, b.Snapshot()); diff != "" {
		t.Errorf("after its requests ended (-want +got)\n%s", diff)
	}
	if len(b.gone) != 0 {
		t.Errorf("%d removed backends remembered, want 0", len(b.gone))
	}
}

func TestConcurrentPicksBalance(t *testing.T) {
	b := New(Health{}, nil)
	b.Update(backends("a:1", "b:1", "c:1", "d:1"))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				be, _ := b.Pick(nil)
				b.Done(be, Answered)
			}
		}()
	}
	wg.Wait()
	for _, l := range b.Snapshot() {
		if l.Outstanding != 0 {
			t.Errorf("%s has %d outstanding after all Done", l.Address, l.Outstanding)
		}
	}
}
