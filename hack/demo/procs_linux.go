package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// childAttr puts a child in its own process group (so a terminal's Ctrl-C
// reaches only the demo, which then stops the children in order) and has
// the kernel kill it if the demo dies without cleaning up.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// readCmdline is the space-joined command line of pid, or "".
func readCmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// pidsMentioning lists the live processes (other than this one) whose
// command line contains marker.
func pidsMentioning(marker string) []int {
	if marker == "" {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if strings.Contains(readCmdline(pid), marker) && !zombie(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// zombie says whether pid has exited and only waits to be reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}
