package fleet

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestConfigRefusals(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		cfg  Config
		want string
	}{
		"local": {
			cfg:  Config{URL: "local"},
			want: `fleet: invalid configuration: --state is "local": local mode needs no shared state`,
		},
		"other scheme": {
			cfg:  Config{URL: "memcached://h:1"},
			want: `fleet: invalid configuration: --state "memcached://h:1": want "local", redis://host:port/db or rediss://host:port/db`,
		},
		"password redacted": {
			cfg:  Config{URL: "http://u:secret@h:1"},
			want: `fleet: invalid configuration: --state "http://u:xxxxx@h:1": want "local", redis://host:port/db or rediss://host:port/db`,
		},
		"no host": {
			cfg:  Config{URL: "redis:///0"},
			want: `fleet: invalid configuration: --state "redis:///0": no host`,
		},
		"bad db": {
			cfg:  Config{URL: "redis://h:1/x"},
			want: `fleet: invalid configuration: --state "redis://h:1/x": redis: invalid database number: "x"`,
		},
		"ttl too short": {
			cfg:  Config{URL: "redis://h:1", LeaseTTL: 50 * time.Millisecond, RenewInterval: 10 * time.Millisecond},
			want: `fleet: invalid configuration: --state-lease-ttl 50ms: want at least 100ms`,
		},
		"renew over half the ttl": {
			cfg:  Config{URL: "redis://h:1", LeaseTTL: 10 * time.Second, RenewInterval: 6 * time.Second},
			want: `fleet: invalid configuration: --state-renew-interval 6s: want at most half of --state-lease-ttl 10s`,
		},
		"negative renew": {
			cfg:  Config{URL: "redis://h:1", RenewInterval: -time.Second},
			want: `fleet: invalid configuration: --state-renew-interval -1s: want more than 0`,
		},
		"hand-off hold below a millisecond": {
			cfg:  Config{URL: "redis://h:1", HandoffHold: -time.Second},
			want: `fleet: invalid configuration: hand-off hold -1s: want at least 1ms`,
		},
		"password twice": {
			cfg:  Config{URL: "redis://:pw@h:1", PasswordFile: empty},
			want: `fleet: invalid configuration: --state carries a password and --redis-password-file is set: give one`,
		},
		"ca file without tls": {
			cfg:  Config{URL: "redis://h:1", CAFile: empty},
			want: `fleet: invalid configuration: --redis-ca-file is set but --state is not rediss://`,
		},
		"ca file without a certificate": {
			cfg:  Config{URL: "rediss://h:1", CAFile: empty},
			want: `fleet: invalid configuration: --redis-ca-file ` + empty + ` holds no PEM certificate`,
		},
		"missing password file": {
			cfg:  Config{URL: "redis://h:1", PasswordFile: filepath.Join(dir, "nope")},
			want: `fleet: invalid configuration: --redis-password-file: open ` + filepath.Join(dir, "nope") + `: no such file or directory`,
		},
		"empty password file": {
			cfg:  Config{URL: "redis://h:1", PasswordFile: empty},
			want: `fleet: invalid configuration: --redis-password-file ` + empty + ` is empty`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g, err := New(tc.cfg)
			if err == nil {
				_ = g.Close()
				t.Fatal("New succeeded")
			}
			if !errors.Is(err, errInvalidConfig) {
				t.Errorf("error %v is not errInvalidConfig", err)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigDefaultsAndOptions(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		cfg                          Config
		ttl, renew, recheck, timeout time.Duration
		password, addr               string
		db                           int
		tls                          bool
	}{
		"defaults": {
			cfg: Config{URL: "redis://10.1.2.3:6380/2"},
			ttl: 10 * time.Second, renew: 3 * time.Second, recheck: 3 * time.Second, timeout: 250 * time.Millisecond,
			addr: "10.1.2.3:6380", db: 2,
		},
		"short ttl picks a renew interval within it": {
			cfg: Config{URL: "redis://h", LeaseTTL: 3 * time.Second},
			ttl: 3 * time.Second, renew: time.Second, recheck: time.Second, timeout: 250 * time.Millisecond,
			addr: "h:6379",
		},
		"tls and password file": {
			cfg: Config{URL: "rediss://cache.example:6390/1", PasswordFile: pw, LeaseTTL: 20 * time.Second, RenewInterval: 5 * time.Second, RecheckInterval: time.Second},
			ttl: 20 * time.Second, renew: 5 * time.Second, recheck: time.Second, timeout: 250 * time.Millisecond,
			password: "s3cret", addr: "cache.example:6390", db: 1, tls: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.defaults()
			if err := cfg.validate(); err != nil {
				t.Fatal(err)
			}
			got := [4]time.Duration{cfg.LeaseTTL, cfg.RenewInterval, cfg.RecheckInterval, cfg.OpTimeout}
			if diff := cmp.Diff([4]time.Duration{tc.ttl, tc.renew, tc.recheck, tc.timeout}, got); diff != "" {
				t.Errorf("durations (-want +got):\n%s", diff)
			}
			o, err := cfg.redisOptions()
			if err != nil {
				t.Fatal(err)
			}
			if o.Addr != tc.addr || o.DB != tc.db || o.Password != tc.password || (o.TLSConfig != nil) != tc.tls {
				t.Errorf("options: addr %q db %d password %q tls %v", o.Addr, o.DB, o.Password, o.TLSConfig != nil)
			}
			if tc.tls && o.TLSConfig.ServerName != "cache.example" {
				t.Errorf("TLS ServerName %q", o.TLSConfig.ServerName)
			}
			// The dispatch path must fail fast, never retry.
			if o.MaxRetries != -1 || o.DialTimeout != tc.timeout || o.ReadTimeout != tc.timeout || !o.ContextTimeoutEnabled {
				t.Errorf("fail-fast options: retries %d dial %s read %s ctx %v", o.MaxRetries, o.DialTimeout, o.ReadTimeout, o.ContextTimeoutEnabled)
			}
		})
	}
}

func TestIsLocal(t *testing.T) {
	for in, want := range map[string]bool{"": true, "local": true, "LOCAL": true, "redis://h": false, "rediss://h": false} {
		if got := IsLocal(in); got != want {
			t.Errorf("IsLocal(%q) = %v", in, got)
		}
	}
}

func TestKeysShareOneHashTag(t *testing.T) {
	tests := map[string]struct {
		pool    string
		wantTag string
	}{
		"namespaced":         {"default/llm", "default/llm"},
		"braces are escaped": {"a{b}c", "a%7Bb%7Dc"},
		"leading close":      {"}x", "%7Dx"},
		"percent":            {"50%", "50%25"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ks := keysFor(tc.pool)
			all := []string{
				ks.slots(), ks.tenantSlots("t{1}"), ks.tierQueued("free}"), ks.tenantQueued("{x"),
				ks.dispatchers(), ks.waiting(), ks.freed(), ks.starved(), ks.handoff(),
			}
			for _, k := range all {
				if got := hashTag(k); got != tc.wantTag {
					t.Errorf("hash tag of %q = %q, want %q", k, got, tc.wantTag)
				}
			}
		})
	}
}

func TestSliceSplitsLikeLocalMode(t *testing.T) {
	tests := map[string]struct {
		pool, n  int
		wantEach []int
		limit    int
		wantLim  []int
	}{
		"even":             {pool: 8, n: 2, wantEach: []int{4, 4}, limit: 2, wantLim: []int{1, 1}},
		"remainder to low": {pool: 7, n: 3, wantEach: []int{3, 2, 2}, limit: 6, wantLim: []int{2, 1, 1}},
		"alone":            {pool: 5, n: 1, wantEach: []int{5}, limit: 3, wantLim: []int{3}},
		"never below one":  {pool: 2, n: 3, wantEach: []int{1, 1, 1}, limit: 1, wantLim: []int{1, 1, 1}},
		"unknown fleet":    {pool: 4, n: 0, wantEach: []int{4}, limit: 2, wantLim: []int{2}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var each, lim []int
			for r := range max(tc.n, 1) {
				s := sliceOf(tc.pool, tc.n, r)
				each = append(each, s.slots)
				lim = append(lim, s.scale(tc.limit))
			}
			if diff := cmp.Diff(tc.wantEach, each); diff != "" {
				t.Errorf("slots (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLim, lim); diff != "" {
				t.Errorf("limit (-want +got):\n%s", diff)
			}
		})
	}
}
