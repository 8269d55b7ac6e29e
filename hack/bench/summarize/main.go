// Command summarize reads `go test -bench` output of hack/bench (from
// stdin) and prints the Dispatcher section's tables: medians over the
// -count runs, and ratios against the baselines measured in the same run.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// samples[benchmark][unit] lists one value per run.
type samples map[string]map[string][]float64

var nameRE = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?$`)

func parse(r io.Reader) samples {
	s := samples{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		m := nameRE.FindStringSubmatch(f[0])
		if m == nil {
			continue
		}
		name := strings.TrimPrefix(m[1], "Benchmark")
		if s[name] == nil {
			s[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			s[name][f[i+1]] = append(s[name][f[i+1]], v)
		}
	}
	return s
}

func (s samples) median(name, unit string) (float64, bool) {
	v := slices.Clone(s[name][unit])
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
}

func main() {
	s := parse(os.Stdin)
	targets := []string{"direct", "reverseproxy", "nginx", "tiergate"}
	runs := 0
	for _, v := range s {
		for _, x := range v {
			runs = max(runs, len(x))
		}
	}
	fmt.Printf("Medians of %d runs.\n\n", runs)

	fmt.Println("**Throughput**, closed loop at 32 concurrent clients, simserver with zero service time:")
	fmt.Println()
	fmt.Println("| target | req/s | × reverseproxy | p50 | p99 | added p50 | added p99 |")
	fmt.Println("|---|---|---|---|---|---|---|")
	rp, _ := s.median("Throughput/reverseproxy", "req/s")
	d50, _ := s.median("Throughput/direct", "p50-µs")
	d99, _ := s.median("Throughput/direct", "p99-µs")
	for _, t := range targets {
		n := "Throughput/" + t
		rps, ok := s.median(n, "req/s")
		if !ok {
			continue
		}
		p50, _ := s.median(n, "p50-µs")
		p99, _ := s.median(n, "p99-µs")
		fmt.Printf("| %s | %.0f | %.2f× | %s | %s | %s | %s |\n", t, rps, rps/rp, us(p50), us(p99), added(t, p50-d50), added(t, p99-d99))
	}
	fmt.Println()
	fmt.Println("**Latency at 1,000 requests/s** (open loop), added to the direct call:")
	fmt.Println()
	fmt.Println("| target | p50 | p99 | added p50 | added p99 | added p99 ÷ reverseproxy's |")
	fmt.Println("|---|---|---|---|---|---|")
	l50, _ := s.median("Latency1000/direct", "p50-µs")
	l99, _ := s.median("Latency1000/direct", "p99-µs")
	rp99, _ := s.median("Latency1000/reverseproxy", "p99-µs")
	for _, t := range targets {
		n := "Latency1000/" + t
		p50, ok := s.median(n, "p50-µs")
		if !ok {
			continue
		}
		p99, _ := s.median(n, "p99-µs")
		ratio := "-"
		if t != "direct" && rp99-l99 > 0 {
			ratio = fmt.Sprintf("%.2f", (p99-l99)/(rp99-l99))
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", t, us(p50), us(p99), added(t, p50-l50), added(t, p99-l99), ratio)
	}
	fmt.Println()
	if p99, ok := s.median("Refusal429", "429-p99-µs"); ok {
		p50, _ := s.median("Refusal429", "429-p50-µs")
		frac, _ := s.median("Refusal429", "refused-fraction")
		fmt.Printf("**429 under 10× overload**: p50 %s, p99 %s (%.0f%% of requests refused).\n\n", us(p50), us(p99), 100*frac)
	}
	if kib, ok := s.median("QueuedMemory", "KiB/queued"); ok {
		q, _ := s.median("QueuedMemory", "queued")
		live, _ := s.median("QueuedMemory", "heap+stack-KiB/queued")
		fmt.Printf("**Memory per queued request** at %.0f queued clients: %.1f KiB of resident set growth ÷ queued (%.1f KiB of Go heap in use + goroutine stacks).\n", q, kib, live)
	}
}

func us(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", v)
}

func added(target string, v float64) string {
	if target == "direct" {
		return "-"
	}
	return us(v)
}
