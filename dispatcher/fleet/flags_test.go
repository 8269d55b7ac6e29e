package fleet

import (
	"flag"
	"io"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestAddFlags(t *testing.T) {
	tests := map[string]struct {
		args       []string
		url        string
		ttl, renew time.Duration
		wantErr    string
	}{
		"defaults are local mode": {url: stateLocal},
		"redis, default timings": {
			args: []string{"--state=redis://127.0.0.1:1/0"},
			url:  "redis://127.0.0.1:1/0", ttl: 10 * time.Second, renew: 3 * time.Second,
		},
		"short ttl": {
			args: []string{"--state=redis://127.0.0.1:1/0", "--state-lease-ttl=2s"},
			url:  "redis://127.0.0.1:1/0", ttl: 2 * time.Second, renew: 2 * time.Second / 3,
		},
		"both": {
			args: []string{"--state=redis://127.0.0.1:1/0", "--state-lease-ttl=30s", "--state-renew-interval=5s"},
			url:  "redis://127.0.0.1:1/0", ttl: 30 * time.Second, renew: 5 * time.Second,
		},
		"renew too slow": {
			args:    []string{"--state=redis://127.0.0.1:1/0", "--state-lease-ttl=4s", "--state-renew-interval=3s"},
			wantErr: "fleet: invalid configuration: --state-renew-interval 3s: want at most half of --state-lease-ttl 4s",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var cfg Config
			AddFlags(fs, &cfg)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if IsLocal(cfg.URL) {
				if tc.url != stateLocal || cfg.URL != stateLocal {
					t.Fatalf("--state %q, want %q", cfg.URL, tc.url)
				}
				return
			}
			g, err := New(cfg)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if g.cfg.URL != tc.url || g.cfg.LeaseTTL != tc.ttl || g.cfg.RenewInterval != tc.renew {
				t.Errorf("url %s ttl %s renew %s, want %s, %s and %s", g.cfg.URL, g.cfg.LeaseTTL, g.cfg.RenewInterval, tc.url, tc.ttl, tc.renew)
			}
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
		"tiergate_state_leases", "tiergate_state_leases_restored_total", "tiergate_state_ops_in_flight",
		"tiergate_state_wakeups_total",
	}
	// The op histogram has no series until a first round trip.
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}
