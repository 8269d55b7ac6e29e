package budget

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestNewRefusesANonPositiveLimit(t *testing.T) {
	for _, n := range []int64{0, -1} {
		if _, err := New(n); err == nil || err.Error() != fmt.Sprintf("budget: the limit must be > 0, got %d", n) {
			t.Errorf("New(%d) = %v", n, err)
		}
	}
}

// step is one operation of a charge sequence: grow charge c by n, or
// release it (n == 0 with release set).
type step struct {
	c       int
	n       int64
	release bool
	wantErr error
}

// state is what a table test checks after every step.
type state struct {
	Used  int64
	Held  []int64
	Fits1 bool // whether one more byte fits
}

func TestChargeSequences(t *testing.T) {
	for name, tc := range map[string]struct {
		limit int64
		steps []step
		want  []state
	}{
		"grow up to the limit, then one byte more is refused and charges nothing": {
			limit: 10,
			steps: []step{{c: 0, n: 4}, {c: 1, n: 6}, {c: 0, n: 1, wantErr: ErrExceeded}},
			want:  []state{{4, []int64{4, 0}, true}, {10, []int64{4, 6}, false}, {10, []int64{4, 6}, false}},
		},
		"a refused growth leaves the smaller one possible": {
			limit: 10,
			steps: []step{{c: 0, n: 8}, {c: 1, n: 3, wantErr: ErrExceeded}, {c: 1, n: 2}},
			want:  []state{{8, []int64{8, 0}, true}, {8, []int64{8, 0}, true}, {10, []int64{8, 2}, false}},
		},
		"release gives back everything once; a second release does nothing": {
			limit: 10,
			steps: []step{{c: 0, n: 3}, {c: 0, n: 4}, {c: 1, n: 3}, {c: 0, release: true}, {c: 0, release: true}, {c: 1, release: true}},
			want: []state{{3, []int64{3, 0}, true}, {7, []int64{7, 0}, true}, {10, []int64{7, 3}, false},
				{3, []int64{0, 3}, true}, {3, []int64{0, 3}, true}, {0, []int64{0, 0}, true}},
		},
		"a released charge can grow again": {
			limit: 5,
			steps: []step{{c: 0, n: 5}, {c: 0, release: true}, {c: 0, n: 5}, {c: 0, release: true}},
			want:  []state{{5, []int64{5}, false}, {0, []int64{0}, true}, {5, []int64{5}, false}, {0, []int64{0}, true}},
		},
		"growing by zero or less charges nothing, even when full": {
			limit: 2,
			steps: []step{{c: 0, n: 2}, {c: 0, n: 0}, {c: 0, n: -5}},
			want:  []state{{2, []int64{2}, false}, {2, []int64{2}, false}, {2, []int64{2}, false}},
		},
		"one charge larger than the whole budget is refused": {
			limit: 4,
			steps: []step{{c: 0, n: 5, wantErr: ErrExceeded}},
			want:  []state{{0, []int64{0}, true}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := New(tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, s := range tc.steps {
				n = max(n, s.c+1)
			}
			charges := make([]Charge, n)
			for i := range charges {
				charges[i] = b.Open()
			}
			for i, s := range tc.steps {
				if s.release {
					charges[s.c].Release()
				} else if err := charges[s.c].Grow(s.n); !errors.Is(err, s.wantErr) || (s.wantErr == nil && err != nil) {
					t.Fatalf("step %d: Grow(%d) = %v, want %v", i, s.n, err, s.wantErr)
				}
				got := state{Used: b.Used(), Fits1: b.Fits(1)}
				for _, c := range charges {
					got.Held = append(got.Held, c.Bytes())
				}
				if diff := cmp.Diff(tc.want[i], got); diff != "" {
					t.Fatalf("after step %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

func TestZeroChargeHoldsNothing(t *testing.T) {
	var c Charge
	if err := c.Grow(1); !errors.Is(err, ErrExceeded) {
		t.Fatalf("Grow on the zero Charge = %v, want ErrExceeded", err)
	}
	c.Release() // must not panic
	if c.Bytes() != 0 {
		t.Fatalf("the zero Charge holds %d", c.Bytes())
	}
}

// TestBudgetReturnsToZero is the property: concurrent holders growing and
// releasing at random never take the budget past its limit, each holds
// exactly what it was granted, and once every holder has released the
// budget is back to 0.
func TestBudgetReturnsToZero(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	const limit, holders, rounds = 1 << 16, 16, 2000
	b, err := New(limit)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var peak int64
	for h := 0; h < holders; h++ {
		wg.Add(1)
		go func(rng *rand.Rand) {
			defer wg.Done()
			c := b.Open()
			var granted int64
			for i := 0; i < rounds; i++ {
				switch rng.IntN(4) {
				case 0:
					c.Release()
					granted = 0
				default:
					n := rng.Int64N(limit / 4)
					if c.Grow(n) == nil {
						granted += max(n, 0)
					}
				}
				if u := b.Used(); u > limit {
					t.Errorf("used %d > limit %d", u, limit)
				}
				if c.Bytes() != granted {
					t.Errorf("charge holds %d, granted %d", c.Bytes(), granted)
				}
				mu.Lock()
				peak = max(peak, b.Used())
				mu.Unlock()
			}
			c.Release()
		}(rand.New(rand.NewPCG(seed, uint64(h))))
	}
	wg.Wait()
	if u := b.Used(); u != 0 {
		t.Fatalf("used %d after every holder released, want 0", u)
	}
	if peak == 0 {
		t.Fatal("nothing was ever charged: the test exercised nothing")
	}
	t.Logf("peak %d of %d", peak, limit)
}
