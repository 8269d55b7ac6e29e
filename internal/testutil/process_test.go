package testutil

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// recorder is a testing.TB whose failures, logs and cleanups are kept for
// the test to inspect; Fatal ends the calling goroutine as testing does.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	logs     []string
	fatal    bool
	cleanups []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.fatal = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// runCleanups runs the cleanups last first, as testing does.
func (r *recorder) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// do runs f as a test body would: on its own goroutine, so that Fatal
// ends f and not the test.
func (r *recorder) do(f func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	<-done
}

// signalOf is the signal that ended a process, or 0.
func signalOf(t *testing.T, err error) syscall.Signal {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("exit %v is not an *exec.ExitError", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() {
		return 0
	}
	return ws.Signal()
}

func mustStart(t *testing.T, cmd *exec.Cmd) *Process {
	t.Helper()
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// ignoringTERM is a process that ignores SIGTERM and says so once it does.
func ignoringTERM(t *testing.T) *Process {
	t.Helper()
	// exec keeps the ignored disposition and leaves no shell behind.
	p := mustStart(t, exec.Command("sh", "-c", `trap "" TERM; echo ready; exec sleep 30`))
	p.WaitOutput(t, 5*time.Second, "the shell set its trap", func(out string) bool { return out == "ready\n" })
	return p
}

func TestOutputIsCapturedInOrder(t *testing.T) {
	p := mustStart(t, exec.Command("sh", "-c", "echo one; echo two >&2; echo three"))
	exited, err := p.Wait(10 * time.Second)
	if !exited || err != nil {
		t.Fatalf("Wait = %v, %v; want true, nil", exited, err)
	}
	if diff := cmp.Diff("one\ntwo\nthree\n", p.Output()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	if !p.Exited() || p.Err() != nil {
		t.Errorf("Exited, Err = %v, %v; want true, nil", p.Exited(), p.Err())
	}
	select {
	case <-p.Done():
	default:
		t.Error("Done is open after the exit")
	}
}

func TestStopEndsWithSIGTERM(t *testing.T) {
	p := mustStart(t, exec.Command("sleep", "30"))
	if p.Err() != nil {
		t.Fatalf("Err of a running process = %v, want nil", p.Err())
	}
	start := time.Now()
	p.Stop(10 * time.Second)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Stop took %s; sleep dies of SIGTERM at once", took)
	}
	if got := signalOf(t, p.Err()); got != syscall.SIGTERM {
		t.Errorf("ended by %v, want SIGTERM", got)
	}
	p.Stop(time.Second) // idempotent: no signal to a reaped pid, no block
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	p := ignoringTERM(t)
	const grace = 300 * time.Millisecond
	start := time.Now()
	p.Stop(grace)
	took := time.Since(start)
	if took < grace {
		t.Errorf("Stop returned after %s, before the %s grace", took, grace)
	}
	if got := signalOf(t, p.Err()); got != syscall.SIGKILL {
		t.Errorf("ended by %v, want SIGKILL", got)
	}
}

func TestTerminateSendsTheGivenSignal(t *testing.T) {
	p := mustStart(t, exec.Command("sleep", "30"))
	p.Terminate(syscall.SIGINT, 10*time.Second)
	if got := signalOf(t, p.Err()); got != syscall.SIGINT {
		t.Errorf("ended by %v, want SIGINT", got)
	}
}

func TestKill(t *testing.T) {
	p := ignoringTERM(t)
	p.Kill()
	if got := signalOf(t, p.Err()); got != syscall.SIGKILL {
		t.Errorf("ended by %v, want SIGKILL", got)
	}
	p.Kill() // idempotent
}

func TestKillGroupKillsTheChildren(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := mustStart(t, cmd)
	var child int
	p.WaitOutput(t, 5*time.Second, "the shell printed its child's pid", func(out string) bool {
		var err error
		child, err = strconv.Atoi(strings.TrimSuffix(out, "\n"))
		return err == nil && strings.HasSuffix(out, "\n")
	})
	p.KillGroup()
	if got := signalOf(t, p.Err()); got != syscall.SIGKILL {
		t.Errorf("the leader ended by %v, want SIGKILL", got)
	}
	p.KillGroup() // idempotent
	// The child is not ours to reap: it is gone once kill(pid, 0) fails,
	// or a zombie waiting for init.
	Eventually(t, 5*time.Second, "the child is dead", func() error {
		if err := syscall.Kill(child, 0); err != nil {
			return nil
		}
		if st := procState(child); st == 'Z' || st == 'X' {
			return nil
		}
		return fmt.Errorf("pid %d still runs", child)
	})
}

// procState is the state letter of /proc/pid/stat, or 0.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

func TestWaitTimesOut(t *testing.T) {
	p := mustStart(t, exec.Command("sleep", "30"))
	start := time.Now()
	exited, err := p.Wait(100 * time.Millisecond)
	if exited || err != nil {
		t.Errorf("Wait = %v, %v; want false, nil", exited, err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("Wait returned after %s", took)
	}
	if p.Exited() {
		t.Error("Exited while sleeping")
	}
}

func TestSignal(t *testing.T) {
	p := mustStart(t, exec.Command("sleep", "30"))
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	exited, err := p.Wait(10 * time.Second)
	if !exited {
		t.Fatal("sleep outlived SIGUSR1")
	}
	if got := signalOf(t, err); got != syscall.SIGUSR1 {
		t.Errorf("ended by %v, want SIGUSR1", got)
	}
	if p.Pid() <= 1 {
		t.Errorf("Pid = %d", p.Pid())
	}
}

func TestStartFailsForAMissingBinary(t *testing.T) {
	_, err := Start(exec.Command("/nonexistent/testutil-binary"))
	if err == nil {
		t.Fatal("Start of a missing binary succeeded")
	}
	r := &recorder{TB: t}
	r.do(func() { StartT(r, exec.Command("/nonexistent/testutil-binary"), Options{Name: "ghost"}) })
	if !r.fatal || len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], "starting ghost: ") {
		t.Errorf("StartT failures = %q, want one fatal \"starting ghost: ...\"", r.errs)
	}
}

func TestExitCode(t *testing.T) {
	exit3 := exec.Command("sh", "-c", "exit 3").Run()
	tests := map[string]struct {
		err    error
		code   int
		wantOK bool
	}{
		"success":     {nil, 0, true},
		"exit status": {exit3, 3, true},
		"no run":      {errors.New("exec: not found"), -1, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, ok := ExitCode(tc.err)
			if code != tc.code || ok != tc.wantOK {
				t.Errorf("ExitCode = %d, %v; want %d, %v", code, ok, tc.code, tc.wantOK)
			}
		})
	}
}

func TestStartTCleanup(t *testing.T) {
	tests := map[string]struct {
		script   string
		opts     Options
		failTest bool
		wantSig  syscall.Signal
		wantErrs []string
		wantLog  string // "" means nothing logged
		// printed is all the script writes before it sleeps ("" means
		// "ready\n"); cleanup waits for it, since a line written after
		// "ready" (stderr especially) may not be captured yet.
		printed string
	}{
		"grace: SIGTERM": {
			script: "echo ready; exec sleep 30", opts: Options{Name: "sleeper", Grace: 10 * time.Second},
			wantSig: syscall.SIGTERM,
		},
		"grace over: SIGKILL": {
			script: `trap "" TERM; echo ready; exec sleep 30`, opts: Options{Name: "stubborn", Grace: 200 * time.Millisecond},
			wantSig: syscall.SIGKILL,
		},
		"no grace: SIGKILL at once": {
			script: "echo ready; exec sleep 30", opts: Options{Name: "sleeper"},
			wantSig: syscall.SIGKILL,
		},
		"a data race fails the test": {
			script: "echo ready; echo '" + RaceWarning + "' >&2; exec sleep 30", opts: Options{Name: "racy", Grace: 10 * time.Second},
			wantSig: syscall.SIGTERM, wantErrs: []string{"racy reported a data race"},
			wantLog: "--- output of racy ---\nready\n" + RaceWarning + "\n",
			printed: "ready\n" + RaceWarning + "\n",
		},
		"a failed test logs the output": {
			script: "echo ready; echo 0123456789; exec sleep 30", opts: Options{Name: "chatty", Grace: 10 * time.Second},
			failTest: true, wantSig: syscall.SIGTERM, wantErrs: []string{"the test failed"},
			wantLog: "--- output of chatty ---\nready\n0123456789\n",
			printed: "ready\n0123456789\n",
		},
		"LogBytes keeps the end": {
			script: "echo ready; echo 0123456789; exec sleep 30", opts: Options{Name: "chatty", Grace: 10 * time.Second, LogBytes: 5},
			failTest: true, wantSig: syscall.SIGTERM, wantErrs: []string{"the test failed"},
			wantLog: "--- output of chatty ---\n6789\n",
			printed: "ready\n0123456789\n",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &recorder{TB: t}
			var p *Process
			r.do(func() { p = StartT(r, exec.Command("sh", "-c", tc.script), tc.opts) })
			if p == nil {
				t.Fatalf("StartT failed: %q", r.errs)
			}
			t.Cleanup(p.Kill)
			printed := tc.printed
			if printed == "" {
				printed = "ready\n"
			}
			p.WaitOutput(t, 5*time.Second, "the script's output", func(out string) bool { return out == printed })
			if tc.failTest {
				r.Errorf("the test failed")
			}
			r.runCleanups()
			if !p.Exited() {
				t.Fatal("the process outlived the cleanup")
			}
			if got := signalOf(t, p.Err()); got != tc.wantSig {
				t.Errorf("ended by %v, want %v", got, tc.wantSig)
			}
			if diff := cmp.Diff(tc.wantErrs, r.errs); diff != "" {
				t.Errorf("test failures (-want +got):\n%s", diff)
			}
			var wantLogs []string
			if tc.wantLog != "" {
				wantLogs = []string{tc.wantLog}
			}
			if diff := cmp.Diff(wantLogs, r.logs); diff != "" {
				t.Errorf("logs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWaitHTTP(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	live := mustStart(t, exec.Command("sleep", "30"))

	t.Run("waits for the status", func(t *testing.T) {
		WaitHTTP(t, live, srv.URL, http.StatusOK, 5*time.Second)
		if n := calls.Load(); n != 3 {
			t.Errorf("%d calls, want 3 (two 503s, then 200)", n)
		}
	})
	t.Run("any status", func(t *testing.T) {
		calls.Store(0)
		WaitHTTP(t, live, srv.URL, 0, 5*time.Second)
		if n := calls.Load(); n != 1 {
			t.Errorf("%d calls, want 1", n)
		}
	})
	t.Run("the process exits", func(t *testing.T) {
		dead := mustStart(t, exec.Command("sh", "-c", "echo bye; exit 7"))
		if exited, _ := dead.Wait(10 * time.Second); !exited {
			t.Fatal("sh did not exit")
		}
		r := &recorder{TB: t}
		r.do(func() { WaitHTTP(r, dead, "http://"+FreeAddr(t, "127.0.0.1")+"/", 0, 5*time.Second) })
		if !r.fatal || len(r.errs) != 1 || !strings.Contains(r.errs[0], "exited while starting (exit status 7):\nbye\n") {
			t.Errorf("failures = %q, want one fatal with the exit and the output", r.errs)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		url := "http://" + FreeAddr(t, "127.0.0.1") + "/"
		r := &recorder{TB: t}
		r.do(func() { WaitHTTP(r, live, url, 0, 100*time.Millisecond) })
		if !r.fatal || len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], url+" not ready within 100ms (") {
			t.Errorf("failures = %q, want one fatal timeout", r.errs)
		}
	})
}

func TestLastBytesAndLines(t *testing.T) {
	tests := map[string]struct{ got, want string }{
		"bytes, short":  {LastBytes("abc", 5), "abc"},
		"bytes, cut":    {LastBytes("abcdef", 2), "ef"},
		"lines, short":  {LastLines("a\nb\n", 5), "a\nb"},
		"lines, cut":    {LastLines("a\nb\nc\nd\n", 2), "c\nd"},
		"lines, no end": {LastLines("a\nb\nc", 1), "c"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAwaitOutput(t *testing.T) {
	tests := map[string]struct {
		script  string
		want    string
		timeout time.Duration
		wantErr string // "" means success
	}{
		"a line written later": {
			script: "echo one; read _; echo two; exec sleep 30", want: "one\ntwo\n", timeout: 10 * time.Second,
		},
		"the last words of a process that exits": {
			script: "echo one; read _; echo bye; exit 0", want: "one\nbye\n", timeout: 10 * time.Second,
		},
		"the process exits first": {
			script: "echo one; read _; exit 4", want: "one\ntwo\n", timeout: 10 * time.Second,
			wantErr: "sh exited (exit status 4) first",
		},
		"timeout": {
			script: "echo one; read _; exec sleep 30", want: "one\ntwo\n", timeout: 200 * time.Millisecond,
			wantErr: "not within 200ms",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", tc.script)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			p := mustStart(t, cmd)
			var calls []string
			errc := make(chan error, 1)
			go func() {
				errc <- p.AwaitOutput(tc.timeout, func(out string) bool { calls = append(calls, out); return out == tc.want })
			}()
			// The script writes its second line only after a first call
			// has seen the first: AwaitOutput must wake on that write.
			p.WaitOutput(t, 10*time.Second, "the first line", func(out string) bool { return out == "one\n" })
			if _, err := io.WriteString(stdin, "go\n"); err != nil {
				t.Fatal(err)
			}
			err = <-errc
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr {
				t.Errorf("AwaitOutput = %q, want %q", got, tc.wantErr)
			}
			if len(calls) == 0 || len(calls) > 4 {
				t.Errorf("cond called %d times with %q: want a call per write, not a poll", len(calls), calls)
			}
		})
	}
	t.Run("WaitOutput fails the test", func(t *testing.T) {
		p := mustStart(t, exec.Command("sleep", "30"))
		r := &recorder{TB: t}
		r.do(func() { p.WaitOutput(r, 50*time.Millisecond, "a word", func(out string) bool { return out != "" }) })
		if diff := cmp.Diff([]string{"a word: not within 50ms"}, r.errs); diff != "" || !r.fatal {
			t.Errorf("failures (-want +got):\n%s", diff)
		}
	})
}

func TestStopClean(t *testing.T) {
	tests := map[string]struct {
		script   string
		within   time.Duration
		wantErrs []string
	}{
		"exits 0 on SIGTERM": {script: `trap 'kill $!; exit 0' TERM; echo ready; sleep 30 & wait`, within: 10 * time.Second},
		"dies of SIGTERM": {script: "echo ready; exec sleep 30", within: 10 * time.Second,
			wantErrs: []string{"sh after SIGTERM: signal: terminated, want exit status 0 within 10s"}},
		"exits 3 on SIGTERM": {script: `trap 'kill $!; exit 3' TERM; echo ready; sleep 30 & wait`, within: 10 * time.Second,
			wantErrs: []string{"sh after SIGTERM: exit status 3, want exit status 0 within 10s"}},
		"ignores SIGTERM": {script: `trap "" TERM; echo ready; exec sleep 30`, within: 300 * time.Millisecond,
			wantErrs: []string{"sh after SIGTERM: signal: killed, want exit status 0 within 300ms"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := mustStart(t, exec.Command("sh", "-c", tc.script))
			p.WaitOutput(t, 5*time.Second, "the trap set", func(out string) bool { return out == "ready\n" })
			r := &recorder{TB: t}
			r.do(func() { p.StopClean(r, tc.within) })
			if diff := cmp.Diff(tc.wantErrs, r.errs); diff != "" {
				t.Errorf("failures (-want +got):\n%s", diff)
			}
			if !p.Exited() {
				t.Error("still running after StopClean")
			}
		})
	}
	t.Run("had exited", func(t *testing.T) {
		p := mustStart(t, exec.Command("sh", "-c", "exit 0"))
		if exited, _ := p.Wait(10 * time.Second); !exited {
			t.Fatal("sh did not exit")
		}
		r := &recorder{TB: t}
		r.do(func() { p.StopClean(r, time.Second) })
		if diff := cmp.Diff([]string{"sh had exited (<nil>) before SIGTERM"}, r.errs); diff != "" {
			t.Errorf("failures (-want +got):\n%s", diff)
		}
	})
}
