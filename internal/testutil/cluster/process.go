package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Component is one process of the cluster (kube-controller-manager,
// kube-scheduler or kwok), writing its output to a log file.
type Component struct {
	Name string
	// Log is the file its stdout and stderr go to.
	Log     string
	healthz string // the URL that answers 200 once it is up, if any
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // cmd.Wait's result; written before done is closed
	// stopped is set once Stop has signalled the group, so a later Stop
	// does not take the signal's exit for a crash.
	stopped atomic.Bool
}

// startComponent starts bin with args as the leader of a new process
// group, its output appended to dir/name.log.
func startComponent(name, dir, bin string, env []string, args ...string) (*Component, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// A group of its own, so Stop reaches whatever it forks too.
	cmd.SysProcAttr = componentAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &Component{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		f.Close()
		close(c.done)
	}()
	return c, nil
}

// Pid is the process's id, which is also its group's.
func (c *Component) Pid() int { return c.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (c *Component) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Err is how the process exited; nil while it runs.
func (c *Component) Err() error {
	if !c.Exited() {
		return nil
	}
	return c.err
}

// Output is the log so far.
func (c *Component) Output() string {
	b, err := os.ReadFile(c.Log)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", c.Log, err)
	}
	return string(b)
}

// Tail is the last n lines of the log.
func (c *Component) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(c.Output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errStillRunning is Stop's error when even SIGKILL did not end the group
// leader in time.
var errStillRunning = errors.New("still running after SIGKILL")

// Stop sends SIGTERM to the process group and waits; SIGKILL to the group
// after grace. The error is nil for an exit that SIGTERM or SIGKILL caused
// (or status 0); an earlier exit with another status is returned, as the
// component died on its own. Idempotent.
func (c *Component) Stop(grace time.Duration) error {
	if c.Exited() && !c.stopped.Load() {
		return c.exitError()
	}
	if !c.stopped.CompareAndSwap(false, true) {
		<-c.done
		return nil
	}
	_ = syscall.Kill(-c.Pid(), syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-c.Pid(), syscall.SIGKILL)
	select {
	case <-c.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d): %w", c.Name, c.Pid(), errStillRunning)
	}
}

// exitError is the exit of a process that ended before Stop asked it to.
func (c *Component) exitError() error {
	if c.err == nil {
		return nil
	}
	return fmt.Errorf("%s exited by itself: %w\n%s", c.Name, c.err, c.Tail(20))
}
