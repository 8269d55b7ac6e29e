package capacity

import (
	"math"
	"math/big"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Exact arithmetic: a float64 would turn floor(3 × 0.7s / 0.7s) into 2.

const maxInt32 = 1<<31 - 1

// shareRat is the Quantity as an exact rational (Quantity keeps an exact
// decimal; a float64 would turn 0.1 into 0.1000000000000000055...).
func shareRat(q resource.Quantity) *big.Rat {
	d := q.AsDec() // q is a copy; AsDec converts it in place
	unscaled := d.UnscaledBig()
	scale := int64(d.Scale())
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(abs64(scale)), nil)
	if scale >= 0 {
		return new(big.Rat).SetFrac(unscaled, pow)
	}
	return new(big.Rat).SetInt(new(big.Int).Mul(unscaled, pow))
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// floorDiv is floor(a/b) for b > 0 (Euclidean division floors then).
func floorDiv(a, b *big.Int) *big.Int {
	q, _ := new(big.Int).DivMod(a, b, new(big.Int))
	return q
}

// ceilDiv is ceil(a/b) for b > 0, saturated at the int64 range.
func ceilDiv(a, b *big.Int) int64 {
	q, m := new(big.Int).DivMod(a, b, new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 1<<63 - 1
	}
	return q.Int64()
}

func floorRat(r *big.Rat) *big.Int { return floorDiv(r.Num(), r.Denom()) }

func clampInt32(v *big.Int) int64 {
	if v.Cmp(big.NewInt(maxInt32)) > 0 {
		return maxInt32
	}
	return v.Int64()
}

func atLeastOne(v int64) int64 {
	if v < 1 {
		return 1
	}
	return v
}

// decimalString formats r with at most prec decimals, trailing zeros cut.
func decimalString(r *big.Rat, prec int) string {
	s := r.FloatString(prec)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// maxDuration is the longest time.Duration. The CRD allows durations up to
// it and base priorities up to 10⁶, so a product or a sum of them may not
// fit: such values are worked out exactly and saturate here.
const maxDuration = time.Duration(math.MaxInt64)

// mulDuration is d × n, exactly.
func mulDuration(d time.Duration, n int64) *big.Int {
	return new(big.Int).Mul(big.NewInt(int64(d)), big.NewInt(n))
}

// addDurations is v + the ds, exactly; v is not changed.
func addDurations(v *big.Int, ds ...time.Duration) *big.Int {
	sum := new(big.Int).Set(v)
	for _, d := range ds {
		sum.Add(sum, big.NewInt(int64(d)))
	}
	return sum
}

// saturate is v as a time.Duration, maxDuration when it is longer.
func saturate(v *big.Int) time.Duration {
	if !v.IsInt64() {
		return maxDuration
	}
	return time.Duration(v.Int64())
}

// longer says whether the exact duration v is longer than d.
func longer(v *big.Int, d time.Duration) bool { return v.Cmp(big.NewInt(int64(d))) > 0 }
