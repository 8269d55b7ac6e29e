package state

import (
	"context"
	"flag"
	"io"
	"sort"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/state/redistest"
)

func TestOpenWithFlags(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	tests := map[string]struct {
		args       []string
		ttl, renew time.Duration
		wantErr    string
	}{
		"defaults": {ttl: 10 * time.Second, renew: 3 * time.Second},
		"short ttl": {
			args: []string{"--state-lease-ttl=2s"},
			ttl:  2 * time.Second, renew: 2 * time.Second / 3,
		},
		"both": {
			args: []string{"--state-lease-ttl=30s", "--state-renew-interval=5s"},
			ttl:  30 * time.Second, renew: 5 * time.Second,
		},
		"renew too slow": {
			args:    []string{"--state-lease-ttl=4s", "--state-renew-interval=3s"},
			wantErr: "state: invalid configuration: --state-renew-interval 3s: want at most half of --state-lease-ttl 4s",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var kicked counter
			gate, closer, err := Open(WithFlags(context.Background(), f), s.URL(0), kicked.wake, logr.Discard())
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer closer.Close()
			g := gate.(*Redis)
			if g.cfg.LeaseTTL != tc.ttl || g.cfg.RenewInterval != tc.renew {
				t.Errorf("ttl %s renew %s, want %s and %s", g.cfg.LeaseTTL, g.cfg.RenewInterval, tc.ttl, tc.renew)
			}
			// Open starts the Gate: a refusal then a release by another
			// dispatcher reach kick.
			g.ObservePolicy(fleetPolicy("ns/open", 1))
			other := newGate(t, s, "other", Config{})
			other.ObservePolicy(fleetPolicy("ns/open", 1))
			if _, err := other.Enqueue("a", "standard", 8, 4); err != nil {
				t.Fatal(err)
			}
			if r := other.Acquire("a", "standard", 1, 2); r != queue.Granted {
				t.Fatal(r)
			}
			if _, err := g.Enqueue("b", "standard", 8, 4); err != nil {
				t.Fatal(err)
			}
			if r := g.Acquire("b", "standard", 1, 2); r != queue.PoolFull {
				t.Fatal(r)
			}
			n := kicked.get()
			other.Release("a", "standard")
			waitFor(t, 5*time.Second, "kick", func() bool { return kicked.get() > n })
			g.Dequeue("b", "standard")
		})
	}
}

func TestGateIsACollector(t *testing.T) {
	g, err := New(Config{URL: "redis://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(g); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	sort.Strings(names)
	want := []string{
		"tiergate_state_degraded", "tiergate_state_dispatchers", "tiergate_state_errors_total",
		"tiergate_state_leases", "tiergate_state_leases_restored_total", "tiergate_state_wakeups_total",
	}
	// The op histogram has no series until a first round trip.
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}
