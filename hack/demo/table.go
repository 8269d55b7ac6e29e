package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// ui writes the demo's progress: log lines during setup and teardown, a
// table redrawn every refresh during the load. On a terminal the table is
// redrawn in place and log lines during the load appear under it; otherwise
// every table is printed one after the other.
type ui struct {
	mu     sync.Mutex
	out    io.Writer
	tty    bool
	start  time.Time
	live   bool
	events []string
}

func newUI(out io.Writer) *ui {
	u := &ui{out: out, start: time.Now()}
	if f, ok := out.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			u.tty = true
		}
	}
	return u
}

// logf prints a progress line.
func (u *ui) logf(format string, args ...any) {
	line := fmt.Sprintf("[demo %6.1fs] ", time.Since(u.start).Seconds()) + fmt.Sprintf(format, args...)
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.live {
		u.events = append(u.events, line)
		if u.tty {
			return
		}
	}
	fmt.Fprintln(u.out, line)
}

// event records a line of the load phase's event log (shown under the
// table) and prints it.
func (u *ui) event(at time.Duration, format string, args ...any) {
	line := fmt.Sprintf("%s  ", clock(at)) + fmt.Sprintf(format, args...)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.events = append(u.events, line)
	if !u.tty || !u.live {
		fmt.Fprintln(u.out, "[event] "+line)
	}
}

// setLive switches the table mode on or off.
func (u *ui) setLive(on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.live = on
}

// lastEvents returns up to n of the latest event lines.
func (u *ui) lastEvents(n int) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.events[max(0, len(u.events)-n):]...)
}

// frame shows one table.
func (u *ui) frame(table string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.tty && u.live {
		fmt.Fprint(u.out, "\x1b[H\x1b[2J"+table)
		return
	}
	fmt.Fprint(u.out, table)
}

// clock formats a load-relative time as mm:ss.s.
func clock(d time.Duration) string {
	if d < 0 {
		return "-" + clock(-d)
	}
	m := int(d / time.Minute)
	s := (d - time.Duration(m)*time.Minute).Seconds()
	return fmt.Sprintf("%02d:%04.1f", m, s)
}

// tableView is everything one table shows.
type tableView struct {
	Now, Load, Grace time.Duration
	Pool             string
	Ready, Replicas  int32
	PerReplica       int
	Sample           sample
	HaveSample       bool
	Tiers            []string
	Live             map[string]*tierLive
	Dispatchers      int
	Events           []string
	ServiceTime      string
	WaitWindow       time.Duration
	// Phase names a phase after the main load ("" for the main load).
	Phase string
}

// renderTable draws the live table. Pure, so it is tested on its own.
func renderTable(v tableView) string {
	var b strings.Builder
	phase := "load"
	if v.Phase != "" {
		phase = v.Phase + " load"
	}
	if v.Now >= v.Load {
		phase = fmt.Sprintf("load ended; outstanding requests may finish until %s", clock(v.Load+v.Grace))
	}
	fmt.Fprintf(&b, "tiergate demo  %s / %s  (%s)\n", clock(v.Now), clock(v.Load), phase)
	s := v.Sample
	if !v.HaveSample {
		fmt.Fprintf(&b, "pool %s: no sample from the dispatchers yet\n", v.Pool)
	} else {
		util := "-"
		if s.Slots > 0 {
			util = fmt.Sprintf("%.0f%%", 100*float64(s.InFlight)/float64(s.Slots))
		}
		fmt.Fprintf(&b, "pool %s: Deployment readyReplicas %d/%d × %d = %d slots; dispatchers hold %d slots, %d in flight (utilisation %s), policy %s on %d/%d ready dispatchers\n",
			v.Pool, v.Ready, v.Replicas, v.PerReplica, int(v.Ready)*v.PerReplica, s.Slots, s.InFlight, util, versions(s.Versions), s.Ready, v.Dispatchers)
		if !s.OK {
			fmt.Fprintf(&b, "  (scrape failed: %s)\n", s.Err)
		}
	}
	fmt.Fprintf(&b, "model: simserver, a stand-in for vLLM, service time %s; waits are client-side over the last %s\n\n", v.ServiceTime, v.WaitWindow)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TIER\tQUEUED\tBOUND\tTENANT CAP\tIN FLIGHT\tSLOT SHARE\tWAIT p50\tWAIT p95\tSERVED\tOPEN\t429 capacity\t429 tenant_limit\t429 rate_limited\t504 queue_timeout\tother\t")
	for _, t := range v.Tiers {
		ts := s.Tiers[t]
		l := v.Live[t]
		if l == nil {
			l = &tierLive{Refused: map[string]int{}}
		}
		share := "-"
		if s.Slots > 0 {
			share = fmt.Sprintf("%.0f%%", 100*float64(ts.InFlight)/float64(s.Slots))
		}
		other := l.Other
		for cause, n := range l.Refused {
			if cause != "capacity" && cause != "tenant_limit" && cause != "rate_limited" && cause != "queue_timeout" {
				other += n
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d+%dq\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n",
			t, ts.Queued, ts.Bound, ts.TenantLimit, ts.TenantQueueLimit, ts.InFlight, share,
			secs(l.P50, l.WindowN), secs(l.P95, l.WindowN), l.Served, l.Pending,
			l.Refused["capacity"], l.Refused["tenant_limit"], l.Refused["rate_limited"], l.Refused["queue_timeout"], other)
	}
	_ = tw.Flush()
	b.WriteString("\nQUEUED and BOUND: summed over the dispatchers; TENANT CAP: one tenant's in-flight + queued limit; OPEN: requests the clients are waiting on\n")
	if len(v.Events) > 0 {
		b.WriteString("\nevents:\n")
		for _, e := range v.Events {
			b.WriteString("  " + e + "\n")
		}
	}
	b.WriteString("\n")
	return b.String()
}

func secs(d time.Duration, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// versions shows "v7", or "v7/v6" while the dispatchers differ.
func versions(vs []int64) string {
	if len(vs) == 0 {
		return "-"
	}
	same := true
	for _, v := range vs {
		same = same && v == vs[0]
	}
	if same {
		return fmt.Sprintf("v%d", vs[0])
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("v%d", v)
	}
	return strings.Join(parts, "/")
}

// fmtSeconds formats seconds for the report; NaN is "-".
func fmtSeconds(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	return fmt.Sprintf("%.2fs", s)
}
