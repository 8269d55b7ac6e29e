package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRenderTable(t *testing.T) {
	v := tableView{
		Now: 12 * time.Second, Load: 30 * time.Second, Grace: 10 * time.Second,
		Pool: "default/llm", Ready: 3, Replicas: 6, PerReplica: 4, Dispatchers: 2,
		HaveSample: true,
		Sample: sample{OK: true, Slots: 12, InFlight: 9, Versions: []int64{5, 5}, Ready: 2, Tiers: map[string]tierSample{
			"premium": {Queued: 2, Bound: 10, InFlight: 6, TenantLimit: 2, TenantQueueLimit: 2},
			"free":    {Queued: 57, Bound: 60, InFlight: 3, TenantLimit: 2, TenantQueueLimit: 4},
		}},
		Tiers: []string{"premium", "free"},
		Live: map[string]*tierLive{
			"premium": {Served: 40, Pending: 8, Refused: map[string]int{"tenant_limit": 30, "rate_limited": 4}, P50: 1200 * time.Millisecond, P95: 4 * time.Second, WindowN: 12},
			"free":    {Served: 7, Pending: 60, Refused: map[string]int{"capacity": 5, "queue_timeout": 2, "draining": 1}, Other: 1},
		},
		Events:      []string{"00:10.0  scale 6→3"},
		ServiceTime: "lognormal:6s,2s", WaitWindow: 10 * time.Second,
	}
	got := strings.Split(renderTable(v), "\n")
	want := []string{
		"tiergate demo  00:12.0 / 00:30.0  (load)",
		"pool default/llm: Deployment readyReplicas 3/6 × 4 = 12 slots; dispatchers hold 12 slots, 9 in flight (utilisation 75%), policy v5 on 2/2 ready dispatchers",
		"model: simserver, a stand-in for vLLM, service time lognormal:6s,2s; waits are client-side over the last 10s",
		"",
		"     TIER  QUEUED  BOUND  TENANT CAP  IN FLIGHT  SLOT SHARE  WAIT p50  WAIT p95  SERVED  OPEN  429 capacity  429 tenant_limit  429 rate_limited  504 queue_timeout  other",
		"  premium       2     10        2+2q          6         50%      1.2s      4.0s      40     8             0                30                 4                  0      0",
		"     free      57     60        2+4q          3         25%         -         -       7    60             5                 0                 0                  2      2",
		"",
		"QUEUED and BOUND: summed over the dispatchers; TENANT CAP: one tenant's in-flight + queued limit; OPEN: requests the clients are waiting on",
		"",
		"events:",
		"  00:10.0  scale 6→3",
		"",
		"",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestRenderTableStates(t *testing.T) {
	tests := map[string]struct {
		v    tableView
		want string
	}{
		"no sample yet":     {v: tableView{Pool: "p", Load: time.Minute}, want: "pool p: no sample from the dispatchers yet"},
		"grace period":      {v: tableView{Now: 31 * time.Second, Load: 30 * time.Second, Grace: 10 * time.Second}, want: "(load ended; outstanding requests may finish until 00:40.0)"},
		"failed scrape":     {v: tableView{HaveSample: true, Sample: sample{Err: "d1: refused"}}, want: "  (scrape failed: d1: refused)"},
		"versions differ":   {v: tableView{HaveSample: true, Sample: sample{OK: true, Versions: []int64{4, 5}}}, want: "policy v4/v5 on"},
		"no slots, no util": {v: tableView{HaveSample: true, Sample: sample{OK: true}}, want: "(utilisation -)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := renderTable(tc.v); !strings.Contains(got, tc.want) {
				t.Errorf("table lacks %q:\n%s", tc.want, got)
			}
		})
	}
}

func TestClock(t *testing.T) {
	tests := map[time.Duration]string{0: "00:00.0", 1500 * time.Millisecond: "00:01.5", 61 * time.Second: "01:01.0", -2 * time.Second: "-00:02.0"}
	for in, want := range tests {
		if got := clock(in); got != want {
			t.Errorf("clock(%s) = %q, want %q", in, got, want)
		}
	}
}
