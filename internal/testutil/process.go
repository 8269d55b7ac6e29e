package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a started child process whose stdout and stderr go, together
// and in order, to one buffer.
type Process struct {
	cmd  *exec.Cmd
	out  buffer
	done chan struct{}
	err  error // cmd.Wait's result; written before done is closed
}

// buffer is a bytes.Buffer the process writes while tests read it; every
// write closes changed and replaces it, which wakes WaitOutput.
type buffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func (l *buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.b.Write(p)
	if l.changed != nil {
		close(l.changed)
	}
	l.changed = make(chan struct{})
	return n, err
}

func (l *buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// next is the output so far and a channel closed by the next write.
func (l *buffer) next() (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.b.String(), l.changed
}

// Start starts cmd with its stdout and stderr captured. The rest of cmd
// (Dir, Env, SysProcAttr) is the caller's. Whoever starts a Process stops
// it; StartT does that in the test's Cleanup.
func Start(cmd *exec.Cmd) (*Process, error) {
	p := &Process{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Options say how StartT names and ends a process.
type Options struct {
	// Name is the process in failure messages; the default is the
	// command's path.
	Name string
	// Grace is how long Cleanup waits after SIGTERM before SIGKILL. Zero
	// means Cleanup sends SIGKILL at once.
	Grace time.Duration
	// LogBytes is how much of the output's end a failed test logs; zero
	// logs all of it.
	LogBytes int
}

// RaceWarning is what a race-detector build prints on a data race.
const RaceWarning = "WARNING: DATA RACE"

// StartT starts cmd for t, failing t when it cannot. When t ends, Cleanup
// stops the process (see Options.Grace), fails t if the process reported a
// data race, and logs its output if t failed.
func StartT(t testing.TB, cmd *exec.Cmd, o Options) *Process {
	t.Helper()
	if o.Name == "" {
		o.Name = cmd.Path
	}
	p, err := Start(cmd)
	if err != nil {
		t.Fatalf("starting %s: %v", o.Name, err)
	}
	t.Cleanup(func() {
		if o.Grace > 0 {
			p.Stop(o.Grace)
		} else {
			p.Kill()
		}
		out := p.Output()
		if strings.Contains(out, RaceWarning) {
			t.Errorf("%s reported a data race", o.Name)
		}
		if t.Failed() {
			if o.LogBytes > 0 {
				out = LastBytes(out, o.LogBytes)
			}
			t.Logf("--- output of %s ---\n%s", o.Name, out)
		}
	})
	return p
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Output is everything the process wrote so far.
func (p *Process) Output() string { return p.out.String() }

// Done is closed when the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the process's exit: nil for status 0, an *exec.ExitError
// otherwise. It is nil while the process runs.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// AwaitOutput waits until cond holds for the output so far, asking again
// after every write. When the process exits first, cond is asked once
// more about the complete output. The error says why it gave up.
func (p *Process) AwaitOutput(timeout time.Duration, cond func(out string) bool) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		out, changed := p.out.next()
		if cond(out) {
			return nil
		}
		select {
		case <-changed:
		case <-p.done:
			// Wait has returned, so the output is complete.
			if cond(p.Output()) {
				return nil
			}
			return fmt.Errorf("%s exited (%v) first", filepath.Base(p.cmd.Path), p.err)
		case <-timer.C:
			return fmt.Errorf("not within %s", timeout)
		}
	}
}

// WaitOutput is AwaitOutput for a test: it fails t when cond does not hold
// in time.
func (p *Process) WaitOutput(t testing.TB, timeout time.Duration, what string, cond func(out string) bool) {
	t.Helper()
	if err := p.AwaitOutput(timeout, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits; SIGKILL after grace. Idempotent.
func (p *Process) Stop(grace time.Duration) { p.Terminate(syscall.SIGTERM, grace) }

// Terminate sends sig and waits; SIGKILL after grace. Idempotent.
func (p *Process) Terminate(sig os.Signal, grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// StopClean sends SIGTERM and fails t unless the process then exits with
// status 0 within the given time (SIGKILL after it).
func (p *Process) StopClean(t testing.TB, within time.Duration) {
	t.Helper()
	if p.Exited() {
		t.Errorf("%s had exited (%v) before SIGTERM", filepath.Base(p.cmd.Path), p.err)
		return
	}
	p.Stop(within)
	if code, _ := ExitCode(p.err); code != 0 {
		t.Errorf("%s after SIGTERM: %v, want exit status 0 within %s", filepath.Base(p.cmd.Path), p.err, within)
	}
}

// Kill is a crash: SIGKILL, no drain; it waits for the exit. Idempotent.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// KillGroup sends SIGKILL to the process's group (the process must lead
// one: SysProcAttr.Setpgid) and waits for the process. Idempotent.
func (p *Process) KillGroup() {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Wait waits up to timeout for the process to exit and returns whether it
// did and its exit (see Err).
func (p *Process) Wait(timeout time.Duration) (exited bool, err error) {
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(timeout):
		return false, nil
	}
}

// ExitCode is the exit status in err: 0 for nil, the code of an
// *exec.ExitError; ok is false for any other error (the command did not
// run), and the code then -1.
func ExitCode(err error) (code int, ok bool) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, true
	case errors.As(err, &ee):
		return ee.ExitCode(), true
	default:
		return -1, false
	}
}

// WaitHTTP waits until url answers with status want (any status when want
// is 0). It fails t when p exits first or timeout passes.
func WaitHTTP(t testing.TB, p *Process, url string, want int, timeout time.Duration) {
	t.Helper()
	if err := awaitHTTP(p, url, want, timeout); err != nil {
		t.Fatalf("%v", err)
	}
}

// errExitedStarting: the process exited before it answered.
var errExitedStarting = errors.New("exited while starting")

// awaitHTTP is WaitHTTP's wait; an error of a process that exited first
// is errExitedStarting.
func awaitHTTP(p *Process, url string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if want == 0 || resp.StatusCode == want {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if p.Exited() {
			return fmt.Errorf("%s %w (%v):\n%s", p.cmd.Path, errExitedStarting, p.err, p.Output())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (%v)", url, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LastBytes is the end of s, at most n bytes of it.
func LastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// LastLines is the end of s, at most n lines of it.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
