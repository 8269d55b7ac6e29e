package dispatcher

import (
	"encoding/pem"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// The defaults, spelled out: a changed default is a decision, visible here
// and in --help (the flags take theirs from DefaultConfig).
func TestDefaultConfig(t *testing.T) {
	want := Config{
		Listen: ":8080", AdminListen: ":9090", PolicyPollInterval: time.Second, DrainTimeout: 30 * time.Second,
		MaxBodyBytes: 4 << 20, BodyTimeout: 30 * time.Second, MaxQueuedBytes: 256 << 20,
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10,
		Backend: Backend{
			DialTimeout: 5 * time.Second, IdleConnTimeout: 90 * time.Second, MaxIdleConnsPerHost: 1024,
			ResponseHeaderTimeout: 5 * time.Minute, MaxResponseHeaderBytes: 1 << 20,
		},
	}
	if diff := cmp.Diff(want, DefaultConfig(), configCmp()); diff != "" {
		t.Errorf("DefaultConfig (-want +got):\n%s", diff)
	}
}

func configCmp() cmp.Option {
	return cmpopts.IgnoreFields(Config{}, "Log", "Clock", "Registry", "AdminTokens", "Forwarder", "Fleet", "Health")
}

// defaults fills every zero field, and only the zero ones.
func TestConfigDefaults(t *testing.T) {
	set := Config{
		Listen: "127.0.0.1:1", AdminListen: "127.0.0.1:2", PolicyPollInterval: 2 * time.Second, DrainTimeout: time.Second,
		MaxBodyBytes: 1, BodyTimeout: time.Second, MaxQueuedBytes: 2, ReadHeaderTimeout: time.Second, IdleTimeout: time.Second, MaxHeaderBytes: 3,
		Backend: Backend{
			DialTimeout: time.Second, IdleConnTimeout: 2 * time.Second, MaxIdleConnsPerHost: 4,
			ResponseHeaderTimeout: 3 * time.Second, MaxResponseHeaderBytes: 5, CAFile: "ca.pem", ServerName: "llm.internal",
		},
	}
	tests := map[string]struct{ in, want Config }{
		"zero takes every default": {in: Config{}, want: DefaultConfig()},
		"set fields are kept":      {in: set, want: set},
		"only the backend's dial timeout set": {
			in: Config{Backend: Backend{DialTimeout: time.Second}},
			want: func() Config {
				c := DefaultConfig()
				c.Backend.DialTimeout = time.Second
				return c
			}(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := tc.in
			got.defaults()
			if diff := cmp.Diff(tc.want, got, configCmp()); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if got.Clock == nil || got.Registry == nil {
				t.Errorf("Clock %v, Registry %v: not defaulted", got.Clock, got.Registry)
			}
		})
	}
}

func TestBackendConfigValidate(t *testing.T) {
	tests := map[string]struct {
		backend Backend
		wantErr string
	}{
		"defaults":          {},
		"negative dial":     {backend: Backend{DialTimeout: -time.Second}, wantErr: "--backend-dial-timeout must be > 0, got -1s"},
		"negative idle":     {backend: Backend{IdleConnTimeout: -time.Second}, wantErr: "--backend-idle-timeout must be > 0, got -1s"},
		"negative head":     {backend: Backend{ResponseHeaderTimeout: -time.Minute}, wantErr: "--backend-response-header-timeout must be > 0, got -1m0s"},
		"negative idle max": {backend: Backend{MaxIdleConnsPerHost: -1}, wantErr: "--backend-max-idle-conns-per-host must be > 0, got -1"},
		"negative head max": {backend: Backend{MaxResponseHeaderBytes: -1}, wantErr: "--backend-max-response-header-bytes must be > 0, got -1"},
		"two at once": {backend: Backend{DialTimeout: -1, MaxIdleConnsPerHost: -2},
			wantErr: "--backend-dial-timeout must be > 0, got -1ns\n--backend-max-idle-conns-per-host must be > 0, got -2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(Config{Backend: tc.backend, Log: logr.Discard()})
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr {
				t.Errorf("err %q, want %q", got, tc.wantErr)
			}
		})
	}
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBackendCAFileRefused(t *testing.T) {
	empty := writeFile(t, "empty.pem", []byte("not a certificate\n"))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := map[string]struct {
		file    string
		wantErr string
		wantIs  error
	}{
		"no certificate in it": {file: empty, wantErr: "--backend-ca-file " + empty + " holds no PEM certificate", wantIs: ErrNoCertificate},
		"missing":              {file: missing, wantErr: "--backend-ca-file: open " + missing + ": no such file or directory", wantIs: fs.ErrNotExist},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(Config{Backend: Backend{CAFile: tc.file}, Log: logr.Discard()})
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if !errors.Is(err, tc.wantIs) {
				t.Errorf("err %v is not %v", err, tc.wantIs)
			}
		})
	}
}

// The backend TLS settings reach the forwarder: an https backend signed by
// a private CA is served with --backend-ca-file, and its certificate is
// checked for --backend-server-name.
func TestBackendTLSFromConfig(t *testing.T) {
	be := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("served"))
	}))
	defer be.Close()
	ca := writeFile(t, "ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: be.Certificate().Raw}))
	// httptest's certificate names example.com and 127.0.0.1.
	tests := map[string]struct {
		backend    Backend
		wantStatus int
		wantBody   string
	}{
		"the private CA":                   {backend: Backend{CAFile: ca}, wantStatus: 200, wantBody: "served"},
		"the private CA and its name":      {backend: Backend{CAFile: ca, ServerName: "example.com"}, wantStatus: 200, wantBody: "served"},
		"the private CA and another name":  {backend: Backend{CAFile: ca, ServerName: "llm.internal"}, wantStatus: 502},
		"the system roots do not trust it": {backend: Backend{}, wantStatus: 502},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(Config{Backend: tc.backend, Log: logr.Discard()})
			if err != nil {
				t.Fatal(err)
			}
			p := pol(1, 1)
			p.Backends = []policy.Backend{{Address: strings.TrimPrefix(be.URL, "https://"), Scheme: "https"}}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Apply(p); err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader("{}"))
			req.Header.Set("X-Tenant-ID", "acme")
			rec := httptest.NewRecorder()
			d.srv.ServeHTTP(rec, req)
			if rec.Code != tc.wantStatus || (tc.wantBody != "" && rec.Body.String() != tc.wantBody) {
				t.Errorf("%d %q, want %d %q", rec.Code, rec.Body.String(), tc.wantStatus, tc.wantBody)
			}
			if tc.wantStatus == 502 && !strings.Contains(rec.Body.String(), `"type":"backend_error"`) {
				t.Errorf("body %q is not a backend_error", rec.Body.String())
			}
		})
	}
}
