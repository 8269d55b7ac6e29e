package testutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// DefaultToolTimeout bounds one run of a Tool whose Timeout is zero.
const DefaultToolTimeout = 2 * time.Minute

// ErrTimeout is what Result.Err wraps when a run was cut off.
var ErrTimeout = errors.New("timed out")

// Tool is a command-line program the suites drive (kubectl, helm): the
// arguments, environment and directory every run shares, and a bound on
// how long one run may take.
type Tool struct {
	Bin string
	// Args come before each run's own (a --kubeconfig, say).
	Args []string
	// Env is added to the test's environment.
	Env []string
	// Dir is the working directory ("" is the test's).
	Dir string
	// Timeout bounds one run; zero means DefaultToolTimeout.
	Timeout time.Duration
}

// Kubectl is bin, a kubectl, run against kubeconfig.
func Kubectl(bin, kubeconfig string) Tool {
	return Tool{Bin: bin, Args: []string{"--kubeconfig=" + kubeconfig}}
}

// Helm is bin, a helm, with its cache, configuration and data under home
// instead of the user's.
func Helm(bin, home string) Tool {
	return Tool{Bin: bin, Env: []string{
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}}
}

// With is a copy of c whose runs take more leading arguments.
func (c Tool) With(args ...string) Tool {
	c.Args = append(append([]string(nil), c.Args...), args...)
	return c
}

// Result is one finished run.
type Result struct {
	// Line is the command as run, for messages.
	Line           string
	Stdout, Stderr string
	// Err is nil for exit status 0, an *exec.ExitError for another, an
	// error wrapping ErrTimeout when the run was cut off, or why the
	// program did not start.
	Err error
}

func (r Result) String() string {
	return fmt.Sprintf("%s: %v\nstdout:\n%s\nstderr:\n%s", r.Line, r.Err, r.Stdout, r.Stderr)
}

// Run runs the program with args.
func (c Tool) Run(args ...string) Result { return c.RunInput("", args...) }

// RunInput runs the program with args and stdin as its standard input.
func (c Tool) RunInput(stdin string, args ...string) Result {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = DefaultToolTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	all := append(append([]string(nil), c.Args...), args...)
	cmd := exec.CommandContext(ctx, c.Bin, all...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	// A child the program left holding its output must not hold Run up.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w after %s (%v)", ErrTimeout, timeout, err)
	}
	line := strings.Join(append([]string{filepath.Base(c.Bin)}, args...), " ")
	return Result{Line: line, Stdout: out.String(), Stderr: errOut.String(), Err: err}
}

// Must runs the program with args, fails t unless it exits with status 0,
// and returns its standard output.
func (c Tool) Must(t testing.TB, args ...string) string {
	t.Helper()
	return c.MustInput(t, "", args...)
}

// MustInput is Must with stdin as the standard input.
func (c Tool) MustInput(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	r := c.RunInput(stdin, args...)
	if r.Err != nil {
		t.Fatalf("%s", r)
	}
	return r.Stdout
}
