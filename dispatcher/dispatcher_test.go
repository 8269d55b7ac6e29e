package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pol(version int64, slots int) *policy.Policy {
	return &policy.Policy{
		Version: version, Pool: "p", Slots: slots, ServiceRate: 1, AgeingRate: 6,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
		DefaultTier:    "free",
		Tiers:          []policy.Tier{{Name: "free", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 2, TenantConcurrencyLimit: 1, TenantQueueLimit: 2}},
		Backends:       []policy.Backend{{Address: "127.0.0.1:1"}},
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestApplyVersions(t *testing.T) {
	d, err := New(Config{Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := d.Ready(); ok || why != "no policy yet" {
		t.Errorf("ready %v %q before a policy", ok, why)
	}
	for _, st := range []struct {
		version int64
		wantErr error
	}{{3, nil}, {3, nil}, {2, policy.ErrStaleVersion}, {4, nil}} {
		ack, err := d.Apply(pol(st.version, 1))
		if !errors.Is(err, st.wantErr) {
			t.Fatalf("apply v%d: %v, want %v", st.version, err, st.wantErr)
		}
		if err == nil && ack.Version != st.version {
			t.Errorf("ack %+v", ack)
		}
	}
	if v := d.Policy().Version; v != 4 {
		t.Errorf("applied version %d", v)
	}
	if ok, _ := d.Ready(); !ok {
		t.Error("not ready with a policy")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		cfg     Config
		wantErr string
	}{
		"defaults":       {cfg: Config{}},
		"negative drain": {cfg: Config{DrainTimeout: -time.Second}, wantErr: "--drain-timeout must be >= 0, got -1s"},
		"negative body":  {cfg: Config{MaxBodyBytes: -2}, wantErr: "--max-body-bytes must be > 0, got -2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg)
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

// Serve loads the policy file, follows its edits, keeps the old policy on
// a bad edit, and on cancellation drains and returns nil, leaving no
// goroutine behind.
func TestServeFileAndDrain(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.json")
	write := func(v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pol(1, 1))
	d, err := New(Config{PolicyFile: file, PolicyPollInterval: 10 * time.Millisecond, DrainTimeout: time.Second, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	data, adm := listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Serve(ctx, data, adm) }()

	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("v1 loaded", func() bool { p := d.Policy(); return p != nil && p.Version == 1 })
	write(pol(2, 3))
	wait("v2 loaded", func() bool { return d.Policy().Version == 2 })
	write(map[string]any{"version": 3, "bogus": true})
	time.Sleep(50 * time.Millisecond)
	if v := d.Policy().Version; v != 2 {
		t.Errorf("version %d after a bad edit", v)
	}
	resp, err := http.Get("http://" + adm.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("readyz %d", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if ok, why := d.Ready(); ok || why != "draining" {
		t.Errorf("ready %v %q after drain", ok, why)
	}
}

func TestServeRefusesBadPolicyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(file, []byte(`{"version":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{PolicyFile: file, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Serve(context.Background(), listen(t), listen(t))
	var verrs policy.ValidationErrors
	if !errors.As(err, &verrs) {
		t.Fatalf("err %v, want validation errors", err)
	}
}

func TestOpenState(t *testing.T) {
	tests := map[string]struct {
		state   string
		wantErr string
	}{
		"local":          {state: "local"},
		"empty is local": {state: ""},
		"unknown scheme": {state: "etcd://x:1", wantErr: `--state: no shared-state backend for scheme "etcd" in this build`},
		"not a URL":      {state: "redis", wantErr: `--state must be "local" or a URL such as redis://host:6379, got "redis"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g, c, err := OpenState(context.Background(), tc.state, func() {}, logr.Discard())
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr || g != nil || c != nil {
				t.Errorf("got %v %v %q, want %q", g, c, got, tc.wantErr)
			}
		})
	}
}
