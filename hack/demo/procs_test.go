//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
)

// groupGone waits up to 5s for every process of the group to be dead
// (zombies count as dead: whoever inherited them reaps them).
func groupGone(pgid int) bool {
	return testutil.Poll(5*time.Second, func() error {
		if m := groupMembers(pgid); len(m) > 0 {
			return fmt.Errorf("group %d has %v", pgid, m)
		}
		return nil
	}) == nil
}

func TestSupervisorStopsGroups(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pids.json")
	s := newSupervisor(dir, pidFile)
	// A well-behaved child, and one that ignores SIGTERM and has a
	// grandchild in its group.
	polite, err := s.start("polite", "/bin/sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	stubborn, err := s.start("stubborn", "/bin/sh", "-c", `trap "" TERM; echo ready; /bin/sleep 60 & wait`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.killAll() })
	// SIGTERM must come after the trap is set.
	testutil.EventuallyTrue(t, 5*time.Second, "the stubborn child's trap", func() bool { return tail(stubborn.Log, 100) == "ready" })
	if polite.PGID != polite.PID || stubborn.PGID != stubborn.PID || polite.PGID == syscall.Getpgrp() {
		t.Fatalf("children are not group leaders: %+v %+v", polite, stubborn)
	}

	var content pidFileContent
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &content); err != nil {
		t.Fatal(err)
	}
	if content.DemoPID != os.Getpid() || len(content.Processes) != 2 || content.Processes[1].Cmdline != `/bin/sh -c trap "" TERM; echo ready; /bin/sleep 60 & wait` {
		t.Fatalf("pid file: %s", b)
	}

	start := time.Now()
	notes := s.stopAll(300 * time.Millisecond)
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "stubborn (pid ") || !strings.HasSuffix(notes[0], ") ignored SIGTERM for 300ms: killed") {
		t.Errorf("notes = %q", notes)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stopAll took %s", took)
	}
	for _, p := range []*proc{polite, stubborn} {
		if !groupGone(p.PGID) {
			t.Errorf("process group of %s survived", p.Name)
		}
	}
	select {
	case p := <-s.Exited():
		t.Errorf("%s reported as an unexpected exit", p.Name)
	default:
	}
	if _, err := s.start("late", "/bin/sleep", "1"); err == nil {
		t.Error("start after stopAll succeeded")
	}
}

func TestSupervisorReportsEarlyExit(t *testing.T) {
	dir := t.TempDir()
	s := newSupervisor(dir, "")
	p, err := s.start("crasher", "/bin/sh", "-c", "echo boom >&2; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-s.Exited():
		if got != p {
			t.Fatalf("exited %s, want crasher", got.Name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit reported")
	}
	if got := tail(p.Log, 100); got != "boom" {
		t.Errorf("log tail = %q, want boom", got)
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("wait error = %v, want exit status 3", p.err)
	}
}

func TestSweepKillsWhatMentionsTheMarker(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "work-marker")
	s := newSupervisor(dir, "")
	// A process the supervisor did not start, as the control plane is: it
	// mentions the work directory in its command line.
	cmd := exec.Command("/bin/sh", "-c", "/bin/sleep 60; : "+marker)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	// Until the shell's child has exec'd sleep, it shows the shell's
	// command line too.
	testutil.Eventually(t, 5*time.Second, "the marked process found", func() error {
		if got := pidsMentioning(marker); len(got) != 1 || got[0] != cmd.Process.Pid {
			return fmt.Errorf("pidsMentioning = %v, want [%d]", got, cmd.Process.Pid)
		}
		return nil
	})
	killed := s.sweep(marker)
	if len(killed) != 1 || !strings.HasPrefix(killed[0], fmt.Sprintf("pid %d (/bin/sh -c /bin/sleep 60; : ", cmd.Process.Pid)) {
		t.Fatalf("sweep = %q", killed)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("swept process ended with %v, want SIGKILL", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the swept process did not die")
	}
	if got := pidsMentioning(marker); len(got) != 0 {
		t.Errorf("after sweep: %v", got)
	}
}

func TestGroupMembers(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "/bin/sleep 60 & /bin/sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	testutil.Eventually(t, 5*time.Second, "the group of three", func() error {
		if m := groupMembers(cmd.Process.Pid); len(m) != 3 {
			return fmt.Errorf("group members %v, want the shell and two sleeps", m)
		}
		return nil
	})
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if !groupGone(cmd.Process.Pid) {
		t.Fatalf("group still has %v", groupMembers(cmd.Process.Pid))
	}
}

// `go run ./hack/demo --workdir DIR` mentions the work directory too: the
// sweep must not kill the demo's own ancestors.
func TestPidsMentioningSkipsAncestors(t *testing.T) {
	if marker := os.Getenv("TIERGATE_DEMO_ANCESTOR_MARKER"); marker != "" {
		fmt.Printf("found %v\n", pidsMentioning(marker))
		return
	}
	marker := filepath.Join(t.TempDir(), "ancestor-marker")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The shell (the parent) and the helper (this binary) both mention the
	// marker; so does an unrelated sibling.
	sibling := exec.Command("/bin/sh", "-c", "/bin/sleep 60; : "+marker)
	if err := sibling.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sibling.Process.Kill(); _ = sibling.Wait() })
	testutil.Eventually(t, 5*time.Second, "the sibling found", func() error {
		if got := pidsMentioning(marker); len(got) != 1 {
			return fmt.Errorf("pidsMentioning = %v before the helper runs, want the sibling only", got)
		}
		return nil
	})
	cmd := exec.Command("/bin/sh", "-c", self+" -test.run=TestPidsMentioningSkipsAncestors -test.count=1; : "+marker)
	cmd.Env = append(os.Environ(), "TIERGATE_DEMO_ANCESTOR_MARKER="+marker)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	want := fmt.Sprintf("found [%d]", sibling.Process.Pid)
	if !strings.Contains(string(out), want) {
		t.Errorf("helper printed %q, want %q", out, want)
	}
}
