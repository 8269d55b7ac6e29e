package clusterscale

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 5, 1, 3, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestParseApplied(t *testing.T) {
	log := strings.Join([]string{
		`{"logger":"","ts":"2026-05-01 03:00:00.120000","level":0,"msg":"starting","listen":"127.0.0.1:1"}`,
		`not JSON at all, from a panic say`,
		`{"logger":"","ts":"2026-05-01 03:00:01.000250","level":0,"msg":"applied policy","version":7,"pool":"llm","slots":200,"tiers":3,"tenants":200,"backends":1000}`,
		`{"logger":"","ts":"2026-05-01 03:00:02.500000","level":0,"msg":"queued body budget","note":"applied policy"}`,
		`{"logger":"","ts":"2026-05-01 03:00:03.000000","level":0,"msg":"applied policy","version":8,"pool":"llm","slots":100,"tiers":3,"tenants":200,"backends":500}`,
	}, "\n")
	got, err := ParseApplied(log, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	want := []Applied{
		{At: at(1000).Add(250 * time.Microsecond), Version: 7, Slots: 200, Backends: 1000},
		{At: at(3000), Version: 8, Slots: 100, Backends: 500},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseApplied (-want +got):\n%s", diff)
	}
}

func TestParseAppliedRefusesMalformedLines(t *testing.T) {
	for _, tc := range []struct{ name, line, want string }{
		{"cut short", `{"ts":"2026-05-01 03:00:01.000000","msg":"applied policy","version":7`,
			`line 1: unexpected end of JSON input: "{\"ts\":\"2026-05-01 03:00:01.000000\",\"msg\":\"applied policy\",\"version\":7"`},
		{"no backends", `{"ts":"2026-05-01 03:00:01.000000","msg":"applied policy","version":7,"slots":1}`,
			`line 1: an applied policy without version, slots or backends: "{\"ts\":\"2026-05-01 03:00:01.000000\",\"msg\":\"applied policy\",\"version\":7,\"slots\":1}"`},
		{"another time layout", `{"ts":"2026-05-01T03:00:01Z","msg":"applied policy","version":7,"slots":1,"backends":1}`,
			`line 1: parsing time "2026-05-01T03:00:01Z" as "2006-01-02 15:04:05.000000": cannot parse "T03:00:01Z" as " "`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseApplied(tc.line, time.UTC)
			if err == nil {
				t.Fatal("no error")
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSettled(t *testing.T) {
	lines := []Applied{
		{At: at(0), Version: 1, Slots: 200, Backends: 1000},    // before the change
		{At: at(1100), Version: 2, Slots: 200, Backends: 700},  // backends leave first
		{At: at(1300), Version: 3, Slots: 200, Backends: 500},  // all gone, slots still old
		{At: at(1500), Version: 4, Slots: 100, Backends: 500},  // the final policy
		{At: at(1700), Version: 4, Slots: 100, Backends: 500},  // applied again
		{At: at(31000), Version: 5, Slots: 100, Backends: 500}, // a resync's new version
	}
	for _, tc := range []struct {
		name   string
		lines  []Applied
		since  time.Time
		want   int
		at     time.Time
		last   Applied
		wantOK bool
	}{
		{"settles on the first apply with the final slots", lines, at(1000), 500, at(1500), lines[5], true},
		{"a change before since is not counted", lines, at(1600), 500, at(1700), lines[5], true},
		{"still at the old backends", lines[:3], at(1000), 1000, time.Time{}, Applied{}, false},
		{"the last apply lacks the backends", lines[:2], at(1000), 500, time.Time{}, Applied{}, false},
		{"no apply since", lines, at(40000), 500, time.Time{}, Applied{}, false},
		{"back to the old count after a dip", append(lines[:2:2], Applied{At: at(1200), Version: 9, Slots: 200, Backends: 1000}), at(1000), 1000, at(1200), Applied{At: at(1200), Version: 9, Slots: 200, Backends: 1000}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotAt, last, ok := Settled(tc.lines, tc.since, tc.want)
			if diff := cmp.Diff([]any{tc.at, tc.last, tc.wantOK}, []any{gotAt, last, ok}); diff != "" {
				t.Errorf("Settled (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSince(t *testing.T) {
	lines := []Applied{{At: at(0)}, {At: at(10)}, {At: at(20)}}
	for _, tc := range []struct {
		t    time.Time
		want int
	}{{at(-1), 3}, {at(0), 3}, {at(5), 2}, {at(20), 1}, {at(21), 0}} {
		if got := len(Since(lines, tc.t)); got != tc.want {
			t.Errorf("Since(%s): %d lines, want %d", tc.t.Sub(t0), got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var out []time.Duration
		for _, n := range ns {
			out = append(out, time.Duration(n)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{"none", nil, .5, 0},
		{"one", ms(7), .99, 7 * time.Millisecond},
		{"median of an even count is the lower", ms(40, 10, 30, 20), .5, 20 * time.Millisecond},
		{"p99 of six is the largest", ms(5, 1, 9, 3, 2, 8), .99, 9 * time.Millisecond},
		{"p99 of 200 is the 198th", ms(seq(200)...), .99, 198 * time.Millisecond},
		{"negative values sort first", ms(-5, 3), .5, -5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.ds, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %v) = %s, want %s", tc.ds, tc.p, got, tc.want)
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}
