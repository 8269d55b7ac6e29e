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
	runs := 0
	for _, v := range s {
		for _, x := range v {
			runs = max(runs, len(x))
		}
	}
	fmt.Printf("Medians of %d rounds; hack/bench and vegeta measure the same targets in each round.\n\n", runs)
	if rev := os.Getenv("BENCH_BEFORE_REV"); rev != "" {
		fmt.Printf("`before` is tiergate built from %s, measured in the same rounds.\n\n", rev)
	}
	s.throughput()
	s.latency()
	s.refusals()
	s.firstByte()
	if kib, ok := s.median("QueuedMemory", "KiB/queued"); ok {
		q, _ := s.median("QueuedMemory", "queued")
		live, _ := s.median("QueuedMemory", "heap+stack-KiB/queued")
		fmt.Printf("**Memory per queued request** at %.0f queued clients: %.1f KiB of resident set growth ÷ queued (%.1f KiB of Go heap in use + goroutine stacks).\n", q, kib, live)
	}
}

var targets = []string{"direct", "reverseproxy", "nginx", "tiergate", "before"}

// measured says whether any of the benchmarks named prefix+"/"+target ran.
func (s samples) measured(target string, prefixes ...string) bool {
	for _, p := range prefixes {
		if _, ok := s[p+"/"+target]; ok {
			return true
		}
	}
	return false
}

// generators are the benchmark name prefixes of the two load generators.
var generators = []struct{ name, prefix string }{{"hack/bench", ""}, {"vegeta", "Vegeta"}}

func (s samples) throughput() {
	fmt.Println("**Throughput**, closed loop, 32 connections, simserver with zero service time:")
	fmt.Println()
	fmt.Println("| target | hack/bench req/s | × nginx | vegeta req/s | × nginx | hack/bench p50 / p99 | vegeta p50 / p99 |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, t := range targets {
		if !s.measured(t, "Throughput", "VegetaThroughput") {
			continue
		}
		row := "| " + t
		var lat string
		for _, g := range generators {
			n := g.prefix + "Throughput/" + t
			rps, ok := s.median(n, "req/s")
			ng, _ := s.median(g.prefix+"Throughput/nginx", "req/s")
			if !ok {
				row += " | - | -"
				lat += " | -"
				continue
			}
			p50, _ := s.median(n, "p50-µs")
			p99, _ := s.median(n, "p99-µs")
			row += fmt.Sprintf(" | %.0f | %.2f×", rps, rps/ng)
			lat += fmt.Sprintf(" | %s / %s", us(p50), us(p99))
		}
		fmt.Println(row + lat + " |")
	}
	fmt.Println()
}

func (s samples) latency() {
	fmt.Println("**Latency at 1,000 requests/s**, open loop; added = the target's median minus direct's, per generator:")
	fmt.Println()
	fmt.Println("| target | hack/bench p50 | p99 | added p99 | vegeta p50 | p99 | added p99 |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, t := range targets {
		if !s.measured(t, "Latency1000", "VegetaLatency1000") {
			continue
		}
		row := "| " + t
		for _, g := range generators {
			n := g.prefix + "Latency1000/" + t
			p50, ok := s.median(n, "p50-µs")
			if !ok {
				row += " | - | - | -"
				continue
			}
			p99, _ := s.median(n, "p99-µs")
			d99, _ := s.median(g.prefix+"Latency1000/direct", "p99-µs")
			row += fmt.Sprintf(" | %s | %s | %s", us(p50), us(p99), added(t, p99-d99))
		}
		fmt.Println(row + " |")
	}
	fmt.Println()
	fmt.Println("hack/bench's view of its own share (medians): how late its requests left, p99 counted from when each was due, its GC cycles per run:")
	fmt.Println()
	fmt.Println("| target | late p99 | p99 from due time | client GCs |")
	fmt.Println("|---|---|---|---|")
	for _, t := range targets {
		n := "Latency1000/" + t
		late, ok := s.median(n, "late-p99-µs")
		if !ok {
			continue
		}
		due, _ := s.median(n, "due-p99-µs")
		gcs, _ := s.median(n, "client-gcs")
		fmt.Printf("| %s | %s | %s | %.0f |\n", t, us(late), us(due), gcs)
	}
	fmt.Println()
}

func (s samples) refusals() {
	if !s.measured("tiergate", "Refusal429", "VegetaRefusal429") {
		return
	}
	fmt.Println("**429 under 10× overload**, open loop at 800 requests/s against a pool that serves 80:")
	fmt.Println()
	fmt.Println("| target | hack/bench 429 p50 | p99 | vegeta 429 p50 | p99 | refused |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, t := range []string{"tiergate", "before"} {
		if !s.measured(t, "Refusal429", "VegetaRefusal429") {
			continue
		}
		row := "| " + t
		var frac float64
		for _, g := range generators {
			n := g.prefix + "Refusal429/" + t
			p50, ok := s.median(n, "429-p50-µs")
			if !ok {
				row += " | - | -"
				continue
			}
			p99, _ := s.median(n, "429-p99-µs")
			frac, _ = s.median(n, "refused-fraction")
			row += fmt.Sprintf(" | %s | %s", us(p50), us(p99))
		}
		fmt.Printf("%s | %.0f%% |\n", row, 100*frac)
	}
	fmt.Println()
}

func (s samples) firstByte() {
	if _, ok := s.median("FirstByte/direct", "ttfb-p50-µs"); !ok {
		return
	}
	fmt.Println("**Time to first byte of a streamed answer** (16 SSE events over 32 ms, the first due after 2 ms; 8 clients):")
	fmt.Println()
	fmt.Println("| target | first event p50 | p99 | added p50 | end of stream p50 |")
	fmt.Println("|---|---|---|---|---|")
	d50, _ := s.median("FirstByte/direct", "ttfb-p50-µs")
	for _, t := range targets {
		n := "FirstByte/" + t
		p50, ok := s.median(n, "ttfb-p50-µs")
		if !ok {
			continue
		}
		p99, _ := s.median(n, "ttfb-p99-µs")
		end, _ := s.median(n, "end-p50-µs")
		fmt.Printf("| %s | %s | %s | %s | %s |\n", t, us(p50), us(p99), added(t, p50-d50), us(end))
	}
	fmt.Println()
}

func us(v float64) string {
	if v >= 1000 || v <= -1000 {
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
