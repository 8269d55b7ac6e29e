package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrExited is wrapped when a child process ended while the demo needed it.
var ErrExited = errors.New("process exited unexpectedly")

// proc is one child process (or a control-plane process envtest started,
// which the supervisor only records and sweeps).
type proc struct {
	Name    string `json:"name"`
	PID     int    `json:"pid"`
	PGID    int    `json:"pgid"`
	Cmdline string `json:"cmdline"`
	Log     string `json:"log,omitempty"`
	// External processes are started and stopped by someone else
	// (envtest); the supervisor records them and kills them if they
	// survive.
	External bool `json:"external,omitempty"`

	cmd  *exec.Cmd
	done chan struct{}
	err  error // of Wait, valid after done
}

// supervisor starts child processes, each in its own process group,
// notices the ones that die early and stops them all.
type supervisor struct {
	logDir  string
	pidFile string

	mu       sync.Mutex
	procs    []*proc
	stopping bool
	exited   chan *proc // unexpected exits, buffered
}

func newSupervisor(logDir, pidFile string) *supervisor {
	return &supervisor{logDir: logDir, pidFile: pidFile, exited: make(chan *proc, 64)}
}

// start runs bin with args, stdout and stderr to logDir/name.log.
func (s *supervisor) start(name, bin string, args ...string) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, fmt.Errorf("not starting %s: the demo is stopping", name)
	}
	logPath := filepath.Join(s.logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{Name: name, PID: cmd.Process.Pid, PGID: cmd.Process.Pid, Log: logPath,
		Cmdline: strings.Join(append([]string{bin}, args...), " "), cmd: cmd, done: make(chan struct{})}
	s.procs = append(s.procs, p)
	s.writePIDFileLocked()
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
		s.mu.Lock()
		early := !s.stopping
		s.mu.Unlock()
		if early {
			select {
			case s.exited <- p:
			default:
			}
		}
	}()
	return p, nil
}

// adopt records a process someone else started (the control plane).
func (s *supervisor) adopt(name string, pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pgid, _ := syscall.Getpgid(pid)
	s.procs = append(s.procs, &proc{Name: name, PID: pid, PGID: pgid, Cmdline: readCmdline(pid), External: true})
	s.writePIDFileLocked()
}

// Exited delivers processes that ended before stopAll.
func (s *supervisor) Exited() <-chan *proc { return s.exited }

// stopAll stops every child it started: SIGTERM to its process group,
// SIGKILL after timeout, then SIGKILL to the group again to sweep any
// grandchild. It returns once every child has been reaped. External
// processes are left to their owner (see sweep).
func (s *supervisor) stopAll(timeout time.Duration) []string {
	s.mu.Lock()
	s.stopping = true
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var notes []string
	for _, p := range procs {
		if p.External {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if note := p.stop(timeout); note != "" {
				mu.Lock()
				notes = append(notes, note)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return notes
}

// stop ends p's process group and reaps p.
func (p *proc) stop(timeout time.Duration) string {
	var note string
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.PGID, syscall.SIGTERM)
		t := time.NewTimer(timeout)
		select {
		case <-p.done:
		case <-t.C:
			note = fmt.Sprintf("%s (pid %d) ignored SIGTERM for %s: killed", p.Name, p.PID, timeout)
			_ = syscall.Kill(-p.PGID, syscall.SIGKILL)
			<-p.done
		}
		t.Stop()
	}
	// The leader is gone; anything left in its group goes too.
	_ = syscall.Kill(-p.PGID, syscall.SIGKILL)
	return note
}

// killAll sends SIGKILL to every recorded process group at once, external
// ones included: the second Ctrl-C.
func (s *supervisor) killAll() {
	s.mu.Lock()
	s.stopping = true
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	for _, p := range procs {
		if p.PGID > 1 && p.PGID != syscall.Getpgrp() {
			_ = syscall.Kill(-p.PGID, syscall.SIGKILL)
		}
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// sweep kills any recorded process still alive (an external process its
// owner failed to stop) and any process whose command line mentions
// marker (the work directory). It returns what it had to kill.
func (s *supervisor) sweep(marker string) []string {
	s.mu.Lock()
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	var killed []string
	for _, p := range procs {
		if alive(p.PID, p.Cmdline) {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
			killed = append(killed, fmt.Sprintf("%s (pid %d)", p.Name, p.PID))
		}
		if p.PGID > 1 && p.PGID != syscall.Getpgrp() {
			for _, pid := range groupMembers(p.PGID) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed = append(killed, fmt.Sprintf("pid %d of %s's process group", pid, p.Name))
			}
		}
	}
	for _, pid := range pidsMentioning(marker) {
		cmdline := readCmdline(pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, fmt.Sprintf("pid %d (%s)", pid, cmdline))
	}
	return killed
}

// count is how many processes were recorded.
func (s *supervisor) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.procs)
}

// pidFileContent is the --pid-file format.
type pidFileContent struct {
	DemoPID   int     `json:"demoPID"`
	Processes []*proc `json:"processes"`
}

func (s *supervisor) writePIDFileLocked() {
	if s.pidFile == "" {
		return
	}
	b, err := json.MarshalIndent(pidFileContent{DemoPID: os.Getpid(), Processes: s.procs}, "", "  ")
	if err != nil {
		return
	}
	tmp := s.pidFile + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err == nil {
		_ = os.Rename(tmp, s.pidFile)
	}
}

// alive says whether pid runs and is still the process recorded with
// cmdline (not a later process that reused the number).
func alive(pid int, cmdline string) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	cur := readCmdline(pid)
	return cur == "" || cmdline == "" || cur == cmdline
}

// tail returns the last n bytes of a log file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(bytes.TrimSpace(b))
}
