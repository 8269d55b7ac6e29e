package demo

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/controlplane"
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
	root, err := testutil.ModuleRoot()
	if err != nil {
		return nil, err
	}
	repoRoot = root
	if k8sBin, err = controlplane.Assets(root); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tiergate-demo-test-")
	if err != nil {
		return nil, err
	}
	demoBin = filepath.Join(dir, "demo")
	if err := testutil.BuildBinary(root, demoBin, "./hack/demo", testutil.BuildOptions{Env: []string{"GOWORK=off"}}); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return func(m *testing.M) int {
		defer os.RemoveAll(dir)
		return m.Run()
	}, nil
}

// demoRun is one demo process, in its own process group as a shell's
// foreground job is.
type demoRun struct {
	*testutil.Process
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
	r := &demoRun{work: filepath.Join(dir, "work"), report: filepath.Join(dir, "demo-report"), pidFile: filepath.Join(dir, "pids.json")}
	args := []string{"--duration", duration, "--report", r.report, "--workdir", r.work,
		"--pid-file", r.pidFile, "--root", repoRoot, "--k8s-bin", k8sBin}
	var cmd *exec.Cmd
	if goRun {
		cmd = exec.Command("go", append([]string{"run", "-trimpath", "./hack/demo"}, args...)...)
		cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	} else {
		cmd = exec.Command(demoBin, args...)
	}
	cmd.Dir = repoRoot
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p, err := testutil.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	r.Process = p
	t.Cleanup(func() {
		r.KillGroup()
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
			t.Logf("--- demo output (last 12 KiB) ---\n%s", testutil.LastBytes(r.Output(), 12<<10))
		}
	})
	return r
}

// wait waits for the demo to exit and returns its exit code.
func (r *demoRun) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	exited, err := r.Wait(timeout)
	if !exited {
		r.KillGroup()
		t.Fatalf("the demo did not exit within %s", timeout)
	}
	code, ok := testutil.ExitCode(err)
	if !ok {
		t.Fatalf("waiting for the demo: %v", err)
	}
	return code
}

// waitOutput waits until the demo printed s, looking at every write.
func (r *demoRun) waitOutput(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	r.WaitOutput(t, timeout, fmt.Sprintf("the demo prints %q", s), func(out string) bool { return strings.Contains(out, s) })
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

// waitNoSurvivors gives processes up to 5s to be reaped, then checks.
func waitNoSurvivors(t *testing.T, r *demoRun, wantAtLeast int) {
	t.Helper()
	// The check below says what survived; the wait only gives it time.
	_ = testutil.Poll(5*time.Second, func() error {
		for _, p := range readPIDFile(t, r.pidFile).Processes {
			if processAlive(p.PID, p.Cmdline) || len(groupMembers(p.PGID)) > 0 {
				return fmt.Errorf("%s is alive", p.Name)
			}
		}
		return nil
	})
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
