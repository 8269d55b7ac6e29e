package clusterscale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Applied is one "applied policy" line of a dispatcher's JSON log: when
// the dispatcher switched to a policy, and what that policy held.
type Applied struct {
	At       time.Time
	Version  int64
	Slots    int
	Backends int
}

// appliedMsg is the message the dispatcher logs after each apply.
const appliedMsg = "applied policy"

// tsLayout is funcr's default timestamp layout (the dispatcher's logger),
// in the process's local time.
const tsLayout = "2006-01-02 15:04:05.000000"

// ParseApplied reads the "applied policy" lines of a dispatcher's JSON
// log, in order. Other lines are skipped; an applied line that does not
// parse is an error, so a changed log format cannot pass for "no apply".
func ParseApplied(log string, loc *time.Location) ([]Applied, error) {
	var out []Applied
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.Contains(line, `"`+appliedMsg+`"`) {
			continue
		}
		var l struct {
			TS       string `json:"ts"`
			Msg      string `json:"msg"`
			Version  *int64 `json:"version"`
			Slots    *int   `json:"slots"`
			Backends *int   `json:"backends"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w: %q", n, err, line)
		}
		if l.Msg != appliedMsg {
			continue
		}
		if l.Version == nil || l.Slots == nil || l.Backends == nil {
			return nil, fmt.Errorf("line %d: an applied policy without version, slots or backends: %q", n, line)
		}
		at, err := time.ParseInLocation(tsLayout, l.TS, loc)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, Applied{At: at, Version: *l.Version, Slots: *l.Slots, Backends: *l.Backends})
	}
	return out, sc.Err()
}

// Settled says since when one dispatcher has held its final policy of a
// change that began at since: the first of the applies at or after since
// from which on every apply has want backends and the slots of the last
// one. ok is false while the last apply since does not have want backends
// (or there is none).
func Settled(lines []Applied, since time.Time, want int) (at time.Time, last Applied, ok bool) {
	i := 0
	for i < len(lines) && lines[i].At.Before(since) {
		i++
	}
	lines = lines[i:]
	if len(lines) == 0 || lines[len(lines)-1].Backends != want {
		return time.Time{}, Applied{}, false
	}
	last = lines[len(lines)-1]
	first := len(lines) - 1
	for first > 0 && lines[first-1].Backends == want && lines[first-1].Slots == last.Slots {
		first--
	}
	return lines[first].At, last, true
}

// Since are the applies at or after t.
func Since(lines []Applied, t time.Time) []Applied {
	i, _ := slices.BinarySearchFunc(lines, t, func(a Applied, t time.Time) int { return a.At.Compare(t) })
	return lines[i:]
}

// Percentile is the nearest-rank p-th quantile (0 < p <= 1) of ds; zero
// for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(rank, 0), len(s)-1)]
}
