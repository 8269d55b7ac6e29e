package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
)

// version is stamped at build time (make build, make image, the Dockerfile:
// -ldflags "-X main.version=…"); an unstamped build says "dev".
var version = "dev"

func init() {
	register("version", "print the build's version and Go release", runVersion)
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tiergate version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, "Usage: tiergate version") }
	if code, done := parseFlags(fs, args, stderr, ""); done {
		return code
	}
	fmt.Fprintf(stdout, "tiergate %s (%s %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}
