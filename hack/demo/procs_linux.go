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

// pidsMentioning lists the live processes whose command line contains
// marker, except this one and its ancestors (`go run ... --workdir DIR`
// mentions the work directory too).
func pidsMentioning(marker string) []int {
	if marker == "" {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	skip := map[int]bool{}
	for pid := os.Getpid(); pid > 1 && !skip[pid]; pid = parentOf(pid) {
		skip[pid] = true
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] {
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
	state, _, ok := procStat(pid)
	return !ok || state == 'Z' || state == 'X'
}

// parentOf is pid's parent, or 0.
func parentOf(pid int) int {
	f := statFields(pid)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// procStat reads a process's state and process group from /proc.
func procStat(pid int) (state byte, pgrp int, ok bool) {
	f := statFields(pid)
	if len(f) < 3 {
		return 0, 0, false
	}
	pgrp, err := strconv.Atoi(f[2])
	return f[0][0], pgrp, err == nil
}

// statFields are the fields of /proc/PID/stat after the command name:
// state, ppid, pgrp, ...
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	// "pid (comm) state ppid pgrp ...": the command name may itself hold
	// spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return nil
	}
	return strings.Fields(s[i+2:])
}

// groupMembers lists the live (not zombie) processes of process group
// pgid.
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, pg, ok := procStat(pid); ok && pg == pgid && state != 'Z' && state != 'X' {
			out = append(out, pid)
		}
	}
	return out
}
