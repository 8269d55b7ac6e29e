package simulate

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSeedHourCompare is the --compare speed pair: one simulated hour
// of the seed example at twice the pool's capacity (the input of
// BenchmarkSeedHourOverload), plain and with --compare fcfs,strict,seed.
// Read the ratio of the two medians of one invocation. cpu-ns/op is the
// process's CPU time per op, which, unlike ns/op, does not count waiting
// for a core on a shared machine.
func BenchmarkSeedHourCompare(b *testing.B) {
	for _, compare := range []string{"none", "fcfs,strict,seed"} {
		b.Run("compare="+compare, func(b *testing.B) {
			in := seedInput(b, "pool.yaml", "load-2x.yaml")
			opts := Options{}
			if compare != "none" {
				opts.Compare = strings.Split(compare, ",")
			}
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := Run(in, opts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the CPU time this process has used, user and system, over
// all its threads.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
