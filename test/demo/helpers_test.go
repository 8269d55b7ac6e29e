package demo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	repoRoot string
	demoBin  string // hack/demo, built once
	k8sBin   string
)

func TestMain(m *testing.M) {
	code, err := setUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/demo:", err)
		os.Exit(1)
	}
	os.Exit(code(m))
}

func setUp() (func(*testing.M) int, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return nil, fmt.Errorf("module root not found at %s: %w", root, err)
	}
	repoRoot = root
	k8sBin = os.Getenv("KUBEBUILDER_ASSETS")
	if k8sBin == "" {
		k8sBin = filepath.Join(root, "bin", "k8s")
	}
	for _, name := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if fi, err := os.Stat(filepath.Join(k8sBin, name)); err != nil || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%s is missing or not executable; run `make tools` first", filepath.Join(k8sBin, name))
		}
	}
	dir, err := os.MkdirTemp("", "tiergate-demo-test-")
	if err != nil {
		return nil, err
	}
	demoBin = filepath.Join(dir, "demo")
	cmd := exec.Command("go", "build", "-o", demoBin, "./hack/demo")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("go build ./hack/demo: %w\n%s", err, out)
	}
	return func(m *testing.M) int {
		defer os.RemoveAll(dir)
		return m.Run()
	}, nil
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// demoRun is one demo process, in its own process group as a shell's
// foreground job is.
type demoRun struct {
	cmd     *exec.Cmd
	out     *lockedBuffer
	done    chan struct{}
	err     error
	work    string
	report  string
	pidFile string
}

// startDemo runs the built demo, or with goRun `go run ./hack/demo` as
// the Makefile does (then go is the process the test starts, and its
// command line mentions the work directory too).
func startDemo(t *testing.T, duration string, goRun bool) *demoRun {
	t.Helper()
	dir := t.TempDir()
	r := &demoRun{out: &lockedBuffer{}, done: make(chan struct{}),
		work: filepath.Join(dir, "work"), report: filepath.Join(dir, "demo-report"), pidFile: filepath.Join(dir, "pids.json")}
	args := []string{"--duration", duration, "--report", r.report, "--workdir", r.work,
		"--pid-file", r.pidFile, "--root", repoRoot, "--k8s-bin", k8sBin}
	if goRun {
		r.cmd = exec.Command("go", append([]string{"run", "./hack/demo"}, args...)...)
		r.cmd.Env = append(os.Environ(), "GOWORK=off")
	} else {
		r.cmd = exec.Command(demoBin, args...)
	}
	r.cmd.Dir = repoRoot
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
		// Whatever the test found, leave nothing running.
		for _, p := range readPIDFile(t, r.pidFile).Processes {
			if processAlive(p.PID, p.Cmdline) {
				_ = syscall.Kill(p.PID, syscall.SIGKILL)
			}
			for _, pid := range groupMembers(p.PGID) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		for _, pid := range pidsMentioning(r.work) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("--- demo output (last 12 KiB) ---\n%s", lastBytes(r.out.String(), 12<<10))
		}
	})
	return r
}

// wait waits for the demo to exit and returns its exit code.
func (r *demoRun) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
		t.Fatalf("the demo did not exit within %s", timeout)
	}
	var ee *exec.ExitError
	switch {
	case r.err == nil:
		return 0
	case errors.As(r.err, &ee):
		return ee.ExitCode()
	default:
		t.Fatalf("waiting for the demo: %v", r.err)
		return -1
	}
}

// waitOutput waits until the demo printed s.
func (r *demoRun) waitOutput(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(r.out.String(), s) {
		select {
		case <-r.done:
			t.Fatalf("the demo exited (%v) before printing %q", r.err, s)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not print %q within %s", s, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pidFile is hack/demo's --pid-file.
type pidFile struct {
	DemoPID   int `json:"demoPID"`
	Processes []struct {
		Name     string `json:"name"`
		PID      int    `json:"pid"`
		PGID     int    `json:"pgid"`
		Cmdline  string `json:"cmdline"`
		External bool   `json:"external"`
	} `json:"processes"`
}

func readPIDFile(t *testing.T, path string) pidFile {
	t.Helper()
	var p pidFile
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return p
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return p
}

// checkNoSurvivors fails the test for any process the demo started that is
// still alive: by PID (unless the number now belongs to another command),
// by process group, and by any command line that mentions the work
// directory.
func checkNoSurvivors(t *testing.T, r *demoRun, wantAtLeast int) {
	t.Helper()
	pf := readPIDFile(t, r.pidFile)
	if pf.DemoPID <= 1 {
		t.Errorf("pid file names demo pid %d", pf.DemoPID)
	} else if state, _, ok := procStat(pf.DemoPID); ok && state != 'Z' && strings.Contains(readCmdline(pf.DemoPID), r.work) {
		t.Errorf("the demo (pid %d) is still running: %s", pf.DemoPID, readCmdline(pf.DemoPID))
	}
	if len(pf.Processes) < wantAtLeast {
		t.Errorf("pid file lists %d processes, want at least %d", len(pf.Processes), wantAtLeast)
	}
	names := map[string]int{}
	for _, p := range pf.Processes {
		names[strings.TrimRight(p.Name, "0123456789-")]++
		if p.PID <= 1 || p.PGID <= 1 {
			t.Errorf("%s: pid %d, pgid %d", p.Name, p.PID, p.PGID)
			continue
		}
		if p.PGID == syscall.Getpgrp() {
			t.Errorf("%s runs in the test's own process group", p.Name)
		}
		if processAlive(p.PID, p.Cmdline) {
			t.Errorf("%s (pid %d) is still running: %s", p.Name, p.PID, readCmdline(p.PID))
		}
		if members := groupMembers(p.PGID); len(members) > 0 {
			t.Errorf("process group %d of %s still has %v", p.PGID, p.Name, members)
		}
	}
	if left := pidsMentioning(r.work); len(left) > 0 {
		t.Errorf("processes mentioning the work directory are still running: %v", left)
	}
	if _, err := os.Stat(r.work); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the work directory %s was not removed: %v", r.work, err)
	}
	t.Logf("processes the demo started: %v", names)
}

// waitNoSurvivors gives processes a moment to be reaped, then checks.
func waitNoSurvivors(t *testing.T, r *demoRun, wantAtLeast int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		alive := false
		for _, p := range readPIDFile(t, r.pidFile).Processes {
			alive = alive || processAlive(p.PID, p.Cmdline) || len(groupMembers(p.PGID)) > 0
		}
		if !alive {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkNoSurvivors(t, r, wantAtLeast)
}

// processAlive is true when pid runs (not a zombie) with the recorded
// command line.
func processAlive(pid int, cmdline string) bool {
	state, _, ok := procStat(pid)
	if !ok || state == 'Z' || state == 'X' {
		return false
	}
	return readCmdline(pid) == cmdline
}

func readCmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

func procStat(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, 0, false
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 3 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(f[2])
	return f[0][0], pgrp, err == nil
}

func allPIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func groupMembers(pgid int) []int {
	var out []int
	for _, pid := range allPIDs() {
		if state, pg, ok := procStat(pid); ok && pg == pgid && state != 'Z' && state != 'X' {
			out = append(out, pid)
		}
	}
	return out
}

func pidsMentioning(marker string) []int {
	var out []int
	for _, pid := range allPIDs() {
		if pid == os.Getpid() {
			continue
		}
		if state, _, ok := procStat(pid); ok && state != 'Z' && strings.Contains(readCmdline(pid), marker) {
			out = append(out, pid)
		}
	}
	return out
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
