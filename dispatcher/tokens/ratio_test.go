package tokens

import (
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var seedFlag = flag.Uint64("seed", 0, "seed for the randomised tests (0: TIERGATE_SEED or random)")

// testSeed is the seed of a randomised test, logged so a failure can be
// rerun with -seed=N or TIERGATE_SEED=N.
func testSeed(t *testing.T) *rand.Rand {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		if s, err := strconv.ParseUint(os.Getenv("TIERGATE_SEED"), 10, 64); err == nil {
			seed = s
		}
	}
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun with -seed=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, 0x746f6b656e73))
}

var approx = cmpopts.EquateApprox(1e-9, 0)

func TestNewRatio(t *testing.T) {
	tests := []struct {
		initial, want float64
	}{
		{4, 4},
		{3.5, 3.5},
		{0.5, 1},
		{-2, 1},
		{100, 32},
		{math.Inf(1), 32},
		{math.Inf(-1), 1},
		{math.NaN(), 4},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, NewRatio(tt.initial).Value(), approx); diff != "" {
			t.Errorf("NewRatio(%v).Value() (-want +got):\n%s", tt.initial, diff)
		}
	}
}

func TestObserve(t *testing.T) {
	type result struct {
		EstimateOverActual float64
		OK                 bool
		Value              float64
	}
	tests := []struct {
		name          string
		bytes, tokens int64
		want          result
	}{
		{"no tokens", 400, 0, result{Value: 4}},
		{"no bytes", 0, 100, result{Value: 4}},
		{"negative tokens", 400, -1, result{Value: 4}},
		{"negative bytes", -1, 100, result{Value: 4}},
		{"exact: the estimate holds", 400, 100, result{1, true, 4}},
		{"tokens twice the estimate", 400, 200, result{0.5, true, 4 * math.Pow(0.5, ratioWeight)}},
		{"a third of the estimate", 600, 50, result{3, true, 4 * math.Pow(2, ratioWeight)}},
		{"the estimate rounds up", 401, 100, result{1.01, true, 4 * math.Pow(4.01/4, ratioWeight)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRatio(4)
			e, ok := r.Observe(tt.bytes, tt.tokens)
			got := result{e, ok, r.Value()}
			if diff := cmp.Diff(tt.want, got, approx); diff != "" {
				t.Errorf("Observe(%d, %d) (-want +got):\n%s", tt.bytes, tt.tokens, diff)
			}
		})
	}
}

// TestRatioConverges: from 4, exact samples of a true ratio bring the
// estimate within 1% of it in the number of samples ratioWeight's comment
// states (0.95^k × |ln(4/true)| <= ln 1.01).
func TestRatioConverges(t *testing.T) {
	tests := []struct {
		truth float64
		want  int
	}{
		{3, 66},
		{6, 73},
		{4, 0},
	}
	for _, tt := range tests {
		r := NewRatio(DefaultBytesPerToken)
		got := 0
		for math.Abs(r.Value()/tt.truth-1) > 0.01 && got < 1000 {
			r.Observe(int64(tt.truth*1000), 1000)
			got++
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("samples to within 1%% of %v (-want +got):\n%s", tt.truth, diff)
		}
	}
}

// TestRatioOutliers: one odd answer moves the estimate by at most 3.5%,
// ten in a row by at most 41%, and it comes back.
func TestRatioOutliers(t *testing.T) {
	r := NewRatio(4)
	r.Observe(100000, 1) // 100000 bytes per token: clamped to 32, then to 2× the estimate
	if diff := cmp.Diff(4*math.Pow(2, ratioWeight), r.Value(), approx); diff != "" {
		t.Errorf("after one outlier (-want +got):\n%s", diff)
	}
	for range 9 {
		r.Observe(100000, 1)
	}
	if diff := cmp.Diff(4*math.Pow(2, 10*ratioWeight), r.Value(), approx); diff != "" {
		t.Errorf("after ten outliers (-want +got):\n%s", diff)
	}
	for range 100 {
		r.Observe(4000, 1000)
	}
	if got := r.Value(); math.Abs(got/4-1) > 0.01 {
		t.Errorf("after 100 normal samples the estimate is %v, want 4 within 1%%", got)
	}
	low := NewRatio(4)
	low.Observe(1, 1000) // 0.001 bytes per token
	if diff := cmp.Diff(4*math.Pow(0.5, ratioWeight), low.Value(), approx); diff != "" {
		t.Errorf("after one low outlier (-want +got):\n%s", diff)
	}
}

// TestRatioNoisy: samples scattered around a true ratio of 3 (log-normal,
// σ = 0.1) with 2% wild answers either way: after 300 the estimate is
// within 10% of 3 (its stationary spread is about 1.6%).
func TestRatioNoisy(t *testing.T) {
	rng := testSeed(t)
	r := NewRatio(4)
	for range 300 {
		ratio := 3 * math.Exp(0.1*rng.NormFloat64())
		if rng.IntN(50) == 0 {
			ratio = []float64{0.01, 1000}[rng.IntN(2)]
		}
		r.Observe(int64(ratio*2000), 2000)
	}
	if got := r.Value(); math.Abs(got/3-1) > 0.1 {
		t.Errorf("estimate %v after 300 noisy samples, want 3 within 10%%", got)
	}
}

// TestRatioBounds: whatever the samples, the estimate stays in range.
func TestRatioBounds(t *testing.T) {
	hi, lo := NewRatio(4), NewRatio(4)
	for range 500 {
		hi.Observe(1<<40, 1)
		lo.Observe(1, 1<<40)
	}
	got := []float64{lo.Value(), hi.Value()}
	if diff := cmp.Diff([]float64{MinBytesPerToken, MaxBytesPerToken}, got, approx); diff != "" {
		t.Errorf("estimates pushed to the edges (-want +got):\n%s", diff)
	}
}

// TestRatioConcurrent: concurrent observers and readers (for -race); the
// estimate ends where the same samples in any order take it, since all
// are equal.
func TestRatioConcurrent(t *testing.T) {
	r := NewRatio(4)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				r.Observe(3000, 1000)
				if v := r.Value(); v < 3-1e-9 || v > 4+1e-9 {
					t.Errorf("Value() = %v, outside [3, 4]", v)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := r.Value(); math.Abs(got/3-1) > 1e-6 {
		t.Errorf("after 1600 samples of 3: %v", got)
	}
}
