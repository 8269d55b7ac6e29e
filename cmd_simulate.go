package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tiergate/tiergate/simulate"
)

func init() {
	register("simulate", "try a tier configuration against synthetic load before applying it", runSimulate)
}

// fileList is a repeatable -f flag.
type fileList []string

func (f *fileList) String() string { return strings.Join(*f, ",") }
func (f *fileList) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// seedFlag remembers whether --seed was given.
type seedFlag struct {
	v   uint64
	set bool
}

func (s *seedFlag) String() string {
	if !s.set {
		return ""
	}
	return strconv.FormatUint(s.v, 10)
}

func (s *seedFlag) Set(v string) error {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return fmt.Errorf("must be a non-negative integer")
	}
	s.v, s.set = n, true
	return nil
}

func runSimulate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tiergate simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files fileList
	var seed seedFlag
	fs.Var(&files, "f", "a YAML file of ModelPool, ServiceTier, TenantQuota and Load documents (repeatable)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of tables")
	plotPath := fs.String("plot", "", "write wait over time per tier to this PNG file")
	fs.Var(&seed, "seed", "random seed; overrides the Load's spec.seed")
	var compare []string
	fs.Func("compare", "also run these schedulers on the same traffic, comma-separated: fcfs, strict, seed, vtc (Tokens fairness), vtc-tokenbound (Tokens fairness and token bounds, needs the pool's spec.tokens rates)", func(v string) error {
		names, err := simulate.ParseCompare(v)
		compare = names
		return err
	})
	comparePlot := fs.String("compare-plot", "", "with --compare: write goodput and waste per scheduler and the wait distribution per tier to this PNG file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: tiergate simulate -f FILE [-f FILE]... [--json] [--plot out.png] [--seed N] [--compare fcfs,strict,seed,vtc,vtc-tokenbound [--compare-plot out.png]]")
		fmt.Fprintln(stderr, "\nRuns the pool's tiers, with the controller's bounds and the real dispatcher queue, against the Load in simulated time.")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args, stderr, " (files go after -f)"); done {
		return code
	}
	if len(files) == 0 {
		fmt.Fprintln(stderr, "tiergate simulate: no input: pass the pool, tiers, quotas and Load with -f")
		return 2
	}

	if *comparePlot != "" && len(compare) == 0 {
		fmt.Fprintln(stderr, "tiergate simulate: --compare-plot needs --compare")
		return 2
	}

	in, err := simulate.ReadFiles(files...)
	if err != nil {
		fmt.Fprintf(stderr, "tiergate simulate: %v\n", err)
		return 1
	}
	opts := simulate.Options{Compare: compare}
	if seed.set {
		opts.Seed = &seed.v
	}
	res, err := simulate.Run(in, opts)
	if err != nil {
		fmt.Fprintf(stderr, "tiergate simulate: %v\n", err)
		return 1
	}
	for _, pl := range []struct {
		path, flag string
		write      func(io.Writer, *simulate.Result) error
	}{{*plotPath, "plot", simulate.WritePlot}, {*comparePlot, "compare-plot", simulate.WriteComparePlot}} {
		if err := writePNG(pl.path, res, pl.write); err != nil {
			fmt.Fprintf(stderr, "tiergate simulate: %s: %v\n", pl.flag, err)
			return 1
		}
	}
	if *asJSON {
		err = simulate.WriteJSON(stdout, res)
	} else {
		err = simulate.WriteText(stdout, res)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tiergate simulate: %v\n", err)
		return 1
	}
	return 0
}

// writePNG renders a plot of res to path; nothing when path is empty.
func writePNG(path string, res *simulate.Result, write func(io.Writer, *simulate.Result) error) error {
	if path == "" {
		return nil
	}
	var buf bytes.Buffer
	if err := write(&buf, res); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
