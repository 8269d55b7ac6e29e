package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tiergate/tiergate/dispatcher"
)

// The flags fill dispatcher.Config; with none given it is DefaultConfig.
func TestDispatcherFlagsFillTheConfig(t *testing.T) {
	withBackend := func(edit func(b *dispatcher.Backend)) dispatcher.Config {
		c := dispatcher.DefaultConfig()
		edit(&c.Backend)
		return c
	}
	tests := map[string]struct {
		args []string
		want dispatcher.Config
	}{
		"none": {want: dispatcher.DefaultConfig()},
		"every backend transport flag": {
			args: []string{
				"--backend-dial-timeout=2s", "--backend-idle-timeout=1m", "--backend-max-idle-conns-per-host=64",
				"--backend-response-header-timeout=10m", "--backend-max-response-header-bytes=65536",
				"--backend-ca-file=/etc/tiergate/backend-ca/ca.crt", "--backend-server-name=vllm.llm.svc",
			},
			want: withBackend(func(b *dispatcher.Backend) {
				*b = dispatcher.Backend{
					DialTimeout: 2 * time.Second, IdleConnTimeout: time.Minute, MaxIdleConnsPerHost: 64,
					ResponseHeaderTimeout: 10 * time.Minute, MaxResponseHeaderBytes: 64 << 10,
					CAFile: "/etc/tiergate/backend-ca/ca.crt", ServerName: "vllm.llm.svc",
				}
			}),
		},
		"one backend flag keeps the other defaults": {
			args: []string{"--backend-dial-timeout=250ms"},
			want: withBackend(func(b *dispatcher.Backend) { b.DialTimeout = 250 * time.Millisecond }),
		},
	}
	ignore := cmpopts.IgnoreFields(dispatcher.Config{}, "Log", "Clock", "Registry", "AdminTokens", "Forwarder", "Health", "Fleet")
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs, f := newDispatcherFlags(&stderr)
			if code, done := parseFlags(fs, tc.args, &stderr, ""); done {
				t.Fatalf("parseFlags: code %d, stderr %q", code, stderr.String())
			}
			if diff := cmp.Diff(tc.want, f.cfg, ignore); diff != "" {
				t.Errorf("Config (-want +got):\n%s", diff)
			}
		})
	}
}

// --help states the defaults dispatcher.Config applies.
func TestDispatcherHelpStatesTheDefaults(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"dispatcher", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
	}
	d := dispatcher.DefaultConfig()
	want := map[string]string{
		"listen": d.Listen, "admin-listen": d.AdminListen, "drain-timeout": d.DrainTimeout.String(),
		"max-body-bytes": "4194304", "body-timeout": d.BodyTimeout.String(), "read-header-timeout": d.ReadHeaderTimeout.String(),
		"backend-dial-timeout": "5s", "backend-idle-timeout": "1m30s", "backend-max-idle-conns-per-host": "1024",
		"backend-response-header-timeout": "5m0s", "backend-max-response-header-bytes": "1048576",
	}
	fs, _ := newDispatcherFlags(&stderr)
	for name, def := range want {
		fl := fs.Lookup(name)
		if fl == nil {
			t.Errorf("no --%s", name)
			continue
		}
		if fl.DefValue != def {
			t.Errorf("--%s default %q, want %q", name, fl.DefValue, def)
		}
		shown := def
		if name == "listen" || name == "admin-listen" {
			shown = `"` + def + `"` // PrintDefaults quotes strings
		}
		if !strings.Contains(stderr.String(), "(default "+shown+")") {
			t.Errorf("--help does not state --%s's default %s", name, def)
		}
	}
}

// A bad transport setting stops the command with 2 and the reason.
func TestDispatcherBadBackendFlags(t *testing.T) {
	noCert := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(noCert, []byte("no certificate here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		args       []string
		wantStderr string
	}{
		"a CA file with no certificate": {[]string{"--backend-ca-file=" + noCert}, "--backend-ca-file " + noCert + " holds no PEM certificate"},
		"a negative dial timeout":       {[]string{"--backend-dial-timeout=-1s"}, "--backend-dial-timeout must be > 0, got -1s"},
		"not a duration":                {[]string{"--backend-idle-timeout=soon"}, `invalid value "soon" for flag -backend-idle-timeout`},
		"not a number":                  {[]string{"--backend-max-idle-conns-per-host=many"}, `invalid value "many" for flag -backend-max-idle-conns-per-host`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"dispatcher", "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0", "--max-queued-bytes=268435456"}, tc.args...)
			if code := dispatch(args, &stdout, &stderr); code != 2 {
				t.Errorf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}
