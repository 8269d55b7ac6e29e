package budget

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// DefaultNoLimit is the budget when no memory limit is known.
const DefaultNoLimit = 256 << 20

// unlimited is where a cgroup v1 limit means none: the kernel reports
// "no limit" as the largest page-aligned int64.
const unlimited = 1 << 62

// Limits are the memory limits known to the process, in bytes; 0 is
// unknown.
type Limits struct {
	// GoMemLimit is the Go runtime's soft limit (GOMEMLIMIT).
	GoMemLimit int64
	// Container is the container's limit as passed on the command line
	// (--memory-limit; the chart passes limits.memory).
	Container int64
	// Cgroup is the limit of the process's cgroup (CgroupLimit).
	Cgroup int64
}

// Smallest is the smallest known limit and what it is, or 0 and "".
func (l Limits) Smallest() (int64, string) {
	var n int64
	var what string
	for _, c := range []struct {
		n    int64
		what string
	}{{l.GoMemLimit, "GOMEMLIMIT"}, {l.Container, "--memory-limit"}, {l.Cgroup, "the cgroup memory limit"}} {
		if c.n > 0 && (n == 0 || c.n < n) {
			n, what = c.n, c.what
		}
	}
	return n, what
}

// Default is the default budget, a quarter of the smallest known memory
// limit or DefaultNoLimit without one, and how it was chosen. A quarter
// leaves room for the Go runtime's headroom over live memory (GOGC=100 lets
// the heap grow to twice what is live), the bodies in flight and the rest
// of the process.
func Default(l Limits) (int64, string) {
	n, what := l.Smallest()
	if n == 0 {
		return DefaultNoLimit, "no memory limit is known (GOMEMLIMIT, --memory-limit, cgroup): " + FormatBytes(DefaultNoLimit)
	}
	return n / 4, fmt.Sprintf("a quarter of %s (%s)", what, FormatBytes(n))
}

// SoftLimit is the Go runtime's soft memory limit to set: 90% of the
// smallest limit when GOMEMLIMIT is not set and another one is known, so
// the collector works harder before the kernel would kill the process; 0
// leaves the runtime as it is.
func SoftLimit(l Limits) int64 {
	if l.GoMemLimit > 0 {
		return 0
	}
	n, _ := l.Smallest()
	return n - n/10
}

// CgroupLimit is the memory limit of the process's cgroup, read from fsys,
// the root file system: for each cgroup of /proc/self/cgroup that can hold
// one (v2's single hierarchy, v1's memory controller), the smallest limit
// of its directory and every parent present under /sys/fs/cgroup ("max"
// and v1's near-2^63 mean none). 0 when none is found.
func CgroupLimit(fsys fs.FS) int64 {
	b, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return 0
	}
	var limit int64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			limit = smaller(limit, walkUp(fsys, "sys/fs/cgroup", f[2], "memory.max"))
		case hasController(f[1], "memory"):
			limit = smaller(limit, walkUp(fsys, "sys/fs/cgroup/memory", f[2], "memory.limit_in_bytes"))
		}
	}
	return limit
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// walkUp is the smallest limit in file under mount/dir and each parent
// directory of dir, up to the mount itself.
func walkUp(fsys fs.FS, mount, dir, file string) int64 {
	var limit int64
	for d := path.Clean("/" + dir); ; d = path.Dir(d) {
		limit = smaller(limit, readLimit(fsys, path.Join(mount, d, file)))
		if d == "/" {
			return limit
		}
	}
}

// readLimit is the limit in one cgroup file, 0 for none or no file.
func readLimit(fsys fs.FS, name string) int64 {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return 0
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= unlimited {
		return 0 // "max", or no limit
	}
	return n
}

// smaller is the smaller of two limits where 0 means none.
func smaller(a, b int64) int64 {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// FormatBytes writes n in the largest binary unit that divides it: "128
// MiB", "1536 KiB", "1000 bytes".
func FormatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}
