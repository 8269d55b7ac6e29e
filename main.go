// Command tiergate is the single binary of the project. Its subcommands are
// controller, dispatcher and simulate; each one's flag wiring lives in a
// cmd_<name>.go file of this package and registers itself here.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// subcommand is one role of the binary. run gets the arguments after the
// subcommand's name and returns the process exit code.
type subcommand struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var subcommands = map[string]subcommand{}

func register(name, summary string, run func(args []string, stdout, stderr io.Writer) int) {
	if _, dup := subcommands[name]; dup {
		panic("tiergate: subcommand registered twice: " + name)
	}
	subcommands[name] = subcommand{summary: summary, run: run}
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		usage(stdout)
		return 0
	}
	cmd, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "tiergate: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return cmd.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tiergate: a tiered, ageing, bounded priority queue in front of a model-serving Deployment.")
	fmt.Fprintln(w, "\nUsage: tiergate <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, subcommands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'tiergate <command> --help' for a command's flags.")
}

// parseFlags parses a subcommand's flags. When done is true the command ends
// at once with code: 0 after --help, 2 after a bad flag (the flag package has
// said why) or a positional argument; hint follows that message.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, hint string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q%s\n", fs.Name(), fs.Args(), hint)
		return 2, true
	}
	return 0, false
}
