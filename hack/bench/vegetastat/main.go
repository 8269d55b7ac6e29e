// Command vegetastat turns vegeta's results (the JSON lines of `vegeta
// encode`, on stdin) into one `go test -bench` line, so hack/bench/summarize
// reads both load generators' figures alike:
//
//	vegeta attack ... | vegeta encode | vegetastat -name VegetaLatency1000/direct
//
// prints "BenchmarkVegetaLatency1000/direct 1 N req/s P p50-µs P p99-µs ..."
// with the quantiles of the 2xx answers, and those of the 429s when there
// are any. Results that started in the first -warmup of the attack (new
// connections) are left out. It fails on transport errors or no answers.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// result is the part of a vegeta result this reads.
type result struct {
	Code      int           `json:"code"`
	Timestamp time.Time     `json:"timestamp"`
	Latency   time.Duration `json:"latency"`
	Error     string        `json:"error"`
}

// stats is what one attack measured.
type stats struct {
	n, errors   int
	first, last time.Time // first start, last end
	ok, refused []time.Duration
	firstError  string
}

func read(r io.Reader, warmup time.Duration) (stats, error) {
	var all []result
	dec := json.NewDecoder(bufio.NewReader(r))
	for {
		var x result
		if err := dec.Decode(&x); err == io.EOF {
			break
		} else if err != nil {
			return stats{}, err
		}
		all = append(all, x)
	}
	if len(all) == 0 {
		return stats{}, fmt.Errorf("no results")
	}
	began := slices.MinFunc(all, func(a, b result) int { return a.Timestamp.Compare(b.Timestamp) }).Timestamp
	var s stats
	for _, x := range all {
		if x.Timestamp.Before(began.Add(warmup)) {
			continue
		}
		s.n++
		if s.first.IsZero() || x.Timestamp.Before(s.first) {
			s.first = x.Timestamp
		}
		if end := x.Timestamp.Add(x.Latency); end.After(s.last) {
			s.last = end
		}
		switch {
		case x.Error != "" && x.Code == 0:
			s.errors++
			if s.firstError == "" {
				s.firstError = x.Error
			}
		case x.Code == 429:
			s.refused = append(s.refused, x.Latency)
		case x.Code/100 == 2:
			s.ok = append(s.ok, x.Latency)
		default:
			s.errors++
			if s.firstError == "" {
				s.firstError = fmt.Sprintf("status %d", x.Code)
			}
		}
	}
	slices.Sort(s.ok)
	slices.Sort(s.refused)
	return s, nil
}

// quantile is the nearest-rank quantile of sorted, in µs.
func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return float64(sorted[max(0, min(i, len(sorted)-1))].Microseconds())
}

func main() {
	name := flag.String("name", "", "benchmark name to print (without the Benchmark prefix)")
	warmup := flag.Duration("warmup", 200*time.Millisecond, "leave out results that started this soon after the first")
	flag.Parse()
	s, err := read(os.Stdin, *warmup)
	if err == nil && s.errors > 0 {
		err = fmt.Errorf("%d of %d requests failed, first: %s", s.errors, s.n, s.firstError)
	}
	if err == nil && len(s.ok)+len(s.refused) == 0 {
		err = fmt.Errorf("no answers after the warm-up")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vegetastat %s: %v\n", *name, err)
		os.Exit(1)
	}
	line := fmt.Sprintf("Benchmark%s\t1\t%.0f req/s", *name, float64(s.n)/s.last.Sub(s.first).Seconds())
	if len(s.ok) > 0 {
		line += fmt.Sprintf("\t%.0f p50-µs\t%.0f p99-µs", quantile(s.ok, .5), quantile(s.ok, .99))
	}
	if len(s.refused) > 0 {
		line += fmt.Sprintf("\t%.0f 429-p50-µs\t%.0f 429-p99-µs\t%.3f refused-fraction",
			quantile(s.refused, .5), quantile(s.refused, .99), float64(len(s.refused))/float64(s.n))
	}
	fmt.Println(line)
}
