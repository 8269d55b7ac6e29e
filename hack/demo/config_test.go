package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		mutate  func(*config)
		wantErr string
	}{
		"defaults":           {mutate: func(*config) {}},
		"short demo":         {mutate: func(c *config) { c.Duration = 30 * time.Second }},
		"explicit subnet":    {mutate: func(c *config) { c.Subnet = "127.0.42" }},
		"duration too short": {mutate: func(c *config) { c.Duration = 14 * time.Second }, wantErr: "bad configuration: --duration must be within [15s, 1h], got 14s"},
		"duration too long":  {mutate: func(c *config) { c.Duration = 2 * time.Hour }, wantErr: "bad configuration: --duration must be within [15s, 1h], got 2h0m0s"},
		"negative grace":     {mutate: func(c *config) { c.Grace = -time.Second }, wantErr: "bad configuration: --grace must be within [0, 5m], got -1s"},
		"refresh too fast":   {mutate: func(c *config) { c.Refresh = time.Millisecond }, wantErr: "bad configuration: --refresh must be within [100ms, 1m], got 1ms"},
		"no requests":        {mutate: func(c *config) { c.MaxRequests = 0 }, wantErr: "bad configuration: --max-requests must be >= 1, got 0"},
		"no service time":    {mutate: func(c *config) { c.ServiceTime = "" }, wantErr: "bad configuration: --service-time must not be empty"},
		"not loopback":       {mutate: func(c *config) { c.Subnet = "10.0.0" }, wantErr: `bad configuration: --subnet must look like 127.A.B (a loopback /24), got "10.0.0"`},
		"the host's /24":     {mutate: func(c *config) { c.Subnet = "127.0.0" }, wantErr: `bad configuration: --subnet 127.0.0 holds 127.0.0.1, where the API server and the simserver listen; choose another`},
		"four octets":        {mutate: func(c *config) { c.Subnet = "127.0.0.1" }, wantErr: `bad configuration: --subnet must look like 127.A.B (a loopback /24), got "127.0.0.1"`},
		"two errors at once": {mutate: func(c *config) { c.MaxRequests = -1; c.Report = "" }, wantErr: "bad configuration: --max-requests must be >= 1, got -1\nbad configuration: --report must not be empty"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := defaultConfig()
			c.Report = "/tmp/report"
			tc.mutate(&c)
			err := c.validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate: nil, want %q", tc.wantErr)
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
			if diff := cmp.Diff(tc.wantErr, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigCompleteGrace(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module github.com/tiergate/tiergate\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		duration, grace, want time.Duration
	}{
		"short demo: a third":      {duration: 30 * time.Second, want: 10 * time.Second},
		"at least 5s":              {duration: 15 * time.Second, want: 5 * time.Second},
		"at most 20s":              {duration: 3 * time.Minute, want: 20 * time.Second},
		"explicit grace is kept":   {duration: 3 * time.Minute, grace: 3 * time.Second, want: 3 * time.Second},
		"explicit grace above 20s": {duration: 30 * time.Second, grace: time.Minute, want: time.Minute},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("KUBEBUILDER_ASSETS", "")
			c := defaultConfig()
			c.Root, c.Duration, c.Grace = filepath.Join(root, "sub", ".."), tc.duration, tc.grace
			if err := c.complete(); err != nil {
				t.Fatal(err)
			}
			if c.Grace != tc.want {
				t.Errorf("grace = %s, want %s", c.Grace, tc.want)
			}
			if c.Root != root || c.K8sBin != filepath.Join(root, "bin", "k8s") || !filepath.IsAbs(c.Report) {
				t.Errorf("root %q, k8s bin %q, report %q", c.Root, c.K8sBin, c.Report)
			}
		})
	}
}

func TestFindRoot(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := findRoot(deep); !errors.Is(err, ErrConfig) {
		t.Fatalf("findRoot without go.mod: %v, want ErrConfig", err)
	}
	// Another module's go.mod is not tiergate's.
	if err := os.WriteFile(filepath.Join(root, "a", "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module github.com/tiergate/tiergate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := findRoot(deep)
	if err != nil || got != root {
		t.Fatalf("findRoot = %q, %v; want %q", got, err, root)
	}
}

func TestNewSchedule(t *testing.T) {
	tests := map[string]struct {
		load time.Duration
		full int32
		want []scaleStep
	}{
		"three minutes": {load: 3 * time.Minute, full: 6, want: []scaleStep{{At: time.Minute, Replicas: 3}, {At: 2 * time.Minute, Replicas: 6}}},
		"short demo":    {load: 30 * time.Second, full: 6, want: []scaleStep{{At: 10 * time.Second, Replicas: 3}, {At: 20 * time.Second, Replicas: 6}}},
		"one replica":   {load: 30 * time.Second, full: 1, want: []scaleStep{{At: 10 * time.Second, Replicas: 1}, {At: 20 * time.Second, Replicas: 1}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newSchedule(tc.load, time.Second, tc.full)
			if diff := cmp.Diff(tc.want, s.Scale); diff != "" {
				t.Errorf("scale steps (-want +got):\n%s", diff)
			}
		})
	}
}
