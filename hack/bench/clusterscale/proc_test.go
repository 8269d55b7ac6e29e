package clusterscale

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		err        string
	}{
		{"a command with spaces and parentheses",
			"4242 (tier gate) (x)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 37 0 0 20 0 12 0 999 1000000 2000 18446744073709551615",
			2870 * time.Millisecond, ""},
		{"no command", "4242 S 1", 0, `/proc stat without a command: "4242 S 1"`},
		{"too few fields", "1 (a) S 1 2 3", 0, "/proc stat with 4 fields after the command, want at least 13"},
		{"not a number", "1 (a) S 1 1 1 0 -1 0 0 0 0 0 x 2 0", 0, `/proc stat CPU time "x": strconv.ParseInt: parsing "x": invalid syntax`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStatCPU(tc.stat)
			if diff := cmp.Diff(tc.err, errString(err)); diff != "" {
				t.Fatalf("error (-want +got):\n%s", diff)
			}
			if got != tc.want {
				t.Errorf("CPU %s, want %s", got, tc.want)
			}
		})
	}
}

func TestParseStatusMemory(t *testing.T) {
	for _, tc := range []struct {
		name, status string
		rss, hwm     int64
		err          string
	}{
		{"both", "Name:\ttiergate\nVmHWM:\t  81920 kB\nVmRSS:\t   40960 kB\nThreads:\t12\n", 40 << 20, 80 << 20, ""},
		{"no HWM", "VmRSS:\t 1 kB\n", 0, 0, "/proc status without VmRSS and VmHWM"},
		{"another unit", "VmRSS:\t 1 MB\nVmHWM:\t 1 kB\n", 0, 0, `/proc status VmRSS: "\t 1 MB", want N kB`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rss, hwm, err := ParseStatusMemory(tc.status)
			if diff := cmp.Diff(tc.err, errString(err)); diff != "" {
				t.Fatalf("error (-want +got):\n%s", diff)
			}
			if rss != tc.rss || hwm != tc.hwm {
				t.Errorf("RSS %d HWM %d, want %d %d", rss, hwm, tc.rss, tc.hwm)
			}
		})
	}
}

// TestReadProcSelf reads this process's own /proc entry: some CPU spent,
// a resident set no larger than its peak.
func TestReadProcSelf(t *testing.T) {
	s, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.RSS <= 0 || s.HWM < s.RSS || s.CPU < 0 {
		t.Errorf("implausible sample of this process: %+v", s)
	}
	if _, err := ReadProc(-1); err == nil {
		t.Error("ReadProc(-1): no error")
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
