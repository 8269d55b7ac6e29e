package simulate

import (
	"strings"
	"testing"
)

// BenchmarkSeedHourCompare is the --compare speed pair: one simulated hour
// of the seed example at twice the pool's capacity (the input of
// BenchmarkSeedHourOverload), plain and with --compare fcfs,strict,seed.
// Read the ratio of the two medians of one invocation.
func BenchmarkSeedHourCompare(b *testing.B) {
	for _, compare := range []string{"none", "fcfs,strict,seed", "fcfs", "strict", "seed"} {
		b.Run("compare="+compare, func(b *testing.B) {
			in := seedInput(b, "pool.yaml", "load-2x.yaml")
			opts := Options{}
			if compare != "none" {
				opts.Compare = strings.Split(compare, ",")
			}
			for b.Loop() {
				if _, err := Run(in, opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
