package clusterscale

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// ProcSample is what /proc says of one process at one moment.
type ProcSample struct {
	// CPU is its user plus system time so far, every thread's.
	CPU time.Duration
	// RSS is its resident set now, HWM the most it has held (bytes).
	RSS, HWM int64
}

// ReadProc samples process pid.
func ReadProc(pid int) (ProcSample, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcSample{}, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcSample{}, err
	}
	var s ProcSample
	if s.CPU, err = ParseStatCPU(string(stat)); err != nil {
		return ProcSample{}, err
	}
	if s.RSS, s.HWM, err = ParseStatusMemory(string(status)); err != nil {
		return ProcSample{}, err
	}
	return s, nil
}

// ParseStatCPU is utime + stime of a /proc/PID/stat line (fields 14 and
// 15, counted after the parenthesised command, which may hold spaces).
func ParseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat without a command: %q", stat)
	}
	// After ") " come the fields from 3 (state) on.
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat with %d fields after the command, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// ParseStatusMemory is VmRSS and VmHWM of /proc/PID/status, in bytes.
func ParseStatusMemory(status string) (rss, hwm int64, err error) {
	found := 0
	for line := range strings.SplitSeq(status, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("/proc status %s: %q, want N kB", key, val)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc status %s: %w", key, err)
		}
		if key == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("/proc status without VmRSS and VmHWM")
	}
	return rss, hwm, nil
}
