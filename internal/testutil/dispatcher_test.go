package testutil

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testPolicy is a valid policy of one tier with backend, as the
// dispatcher's JSON.
func testPolicy(version int, backend string) map[string]any {
	return map[string]any{
		"version": version, "pool": "tg/llm", "slots": 4, "serviceRate": 1, "ageingRate": 6,
		"authentication": map[string]any{"mode": "TrustedHeader", "headerName": "X-Tenant-ID"},
		"tiers": []map[string]any{{"name": "premium", "tolerableWaitSeconds": 5, "queueBound": 5,
			"tenantConcurrencyLimit": 1, "tenantQueueLimit": 1}},
		"backends": []map[string]any{{"address": backend, "scheme": "http"}},
	}
}

// appliedVersion is the version of the dispatcher's applied policy.
func appliedVersion(t *testing.T, d *Dispatcher) int {
	t.Helper()
	var p struct{ Version int }
	GetJSON(t, d.AdminURL("/v1/policy"), d.Token, &p)
	return p.Version
}

// applied matches the dispatcher's log line for an applied policy version.
func applied(version int) func(string) bool {
	return func(out string) bool {
		return strings.Contains(out, fmt.Sprintf(`"msg"="applied policy" "version"=%d `, version))
	}
}

func TestDispatcherWithoutPolicy(t *testing.T) {
	bins := binaries(t)
	sim := StartSimserver(t, bins.Simserver, SimOptions{})
	d := StartDispatcher(t, bins.Tiergate, DispatcherOptions{})
	if d.Token != DispatcherToken || d.PolicyFile != "" || d.Data == d.Admin {
		t.Errorf("dispatcher %+v", d)
	}
	if code, body := d.AdminDo(t, http.MethodGet, "/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz without a policy: %d %s", code, body)
	}
	if code, body := d.AdminDo(t, http.MethodPut, "/v1/policy", "wrong", []byte("{}")); code != http.StatusUnauthorized {
		t.Errorf("PUT with a wrong token: %d %s", code, body)
	}
	d.MustPutPolicy(t, testPolicy(1, sim.Addr))
	invalid := testPolicy(2, sim.Addr)
	invalid["slots"] = -1
	if code, body := d.PutPolicy(t, invalid); code != http.StatusBadRequest {
		t.Errorf("PUT of an invalid policy: %d %s", code, body)
	}
	if code, body := d.AdminDo(t, http.MethodGet, "/readyz", "", nil); code != http.StatusOK {
		t.Errorf("/readyz with a policy: %d %s", code, body)
	}
	var st struct {
		Queue struct{ Slots, PolicyVersion int }
	}
	d.Stats(t, &st)
	if st.Queue.Slots != 4 || st.Queue.PolicyVersion != 1 {
		t.Errorf("stats %+v, want 4 slots of version 1", st)
	}
	if got := d.Metrics(t)[`tiergate_policy_version{pool="tg/llm"}`]; got != 1 {
		t.Errorf("tiergate_policy_version = %v, want 1", got)
	}
	resp, err := http.Get(d.DataURL("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("data port without a tenant: %s, want 401", resp.Status)
	}
	d.StopClean(t, 20*time.Second)
}

func TestDispatcherWithPolicyFileAndToken(t *testing.T) {
	bins := binaries(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin, data := FreeAddr(t, "127.0.0.1"), FreeAddr(t, "127.0.0.1")
	d := StartDispatcher(t, bins.Tiergate, DispatcherOptions{
		Options: Options{Name: "watched", Grace: 10 * time.Second},
		Admin:   admin, Data: data, TokenFile: tokenFile,
		Policy: testPolicy(1, "127.0.0.1:1"), Args: []string{"-v", "1"}, Ready: "/readyz",
	})
	if diff := cmp.Diff([]string{admin, data, "from-a-file"}, []string{d.Admin, d.Data, d.Token}); diff != "" {
		t.Errorf("addresses and token (-want +got):\n%s", diff)
	}
	if v := appliedVersion(t, d); v != 1 {
		t.Errorf("version %d from the policy file, want 1", v)
	}
	WritePolicyFile(t, d.PolicyFile, testPolicy(2, "127.0.0.1:1"))
	d.WaitOutput(t, 20*time.Second, "version 2 from the file", applied(2))
	if v := appliedVersion(t, d); v != 2 {
		t.Errorf("version %d after the file changed, want 2", v)
	}
	if _, err := os.Stat(d.PolicyFile + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("WritePolicyFile left its temporary file: %v", err)
	}
}

func TestDispatcherFailsToStart(t *testing.T) {
	bins := binaries(t)
	tests := map[string]struct {
		opts DispatcherOptions
		want string
	}{
		"a bad flag":           {DispatcherOptions{Args: []string{"--no-such-flag"}}, " exited while starting (exit status 2):\n"},
		"never ready":          {DispatcherOptions{Ready: "/readyz", ReadyTimeout: 500 * time.Millisecond}, "/readyz not ready within 500ms (status 503 Service Unavailable)"},
		"a missing token file": {DispatcherOptions{TokenFile: "/nonexistent/token"}, "reading the admin token: open /nonexistent/token: no such file or directory"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &recorder{TB: t}
			r.do(func() { StartDispatcher(r, bins.Tiergate, tc.opts) })
			r.runCleanups()
			if !r.fatal || len(r.errs) != 1 || !strings.Contains(r.errs[0], tc.want) {
				t.Errorf("failures %q, want one with %q", r.errs, tc.want)
			}
		})
	}
}

func TestWritePolicyFileFailures(t *testing.T) {
	r := &recorder{TB: t}
	r.do(func() { WritePolicyFile(r, filepath.Join(t.TempDir(), "policy.json"), func() {}) })
	if !r.fatal || len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], "encoding the policy: json: unsupported type") {
		t.Errorf("failures %q", r.errs)
	}
	r = &recorder{TB: t}
	r.do(func() { WritePolicyFile(r, "/nonexistent/dir/policy.json", testPolicy(1, "127.0.0.1:1")) })
	if !r.fatal || len(r.errs) != 1 || r.errs[0] != "writing policy.json.tmp: open /nonexistent/dir/policy.json.tmp: no such file or directory" {
		t.Errorf("failures %q", r.errs)
	}
}

func TestDispatcherAdminFailures(t *testing.T) {
	d := StartDispatcher(t, binaries(t).Tiergate, DispatcherOptions{})
	invalid := testPolicy(1, "127.0.0.1:1")
	invalid["slots"] = -1
	// In order: the last one stops the dispatcher.
	tests := []struct {
		name string
		call func(testing.TB)
		want string
	}{
		{"an invalid policy", func(tb testing.TB) { d.MustPutPolicy(tb, invalid) }, "PUT /v1/policy: 400 {"},
		{"a policy that is not JSON", func(tb testing.TB) { d.PutPolicy(tb, make(chan int)) }, "encoding the policy: json: unsupported type: chan int"},
		{"a bad method", func(tb testing.TB) { d.AdminDo(tb, "BAD METHOD", "/v1/policy", "", nil) }, `BAD METHOD /v1/policy: net/http: invalid method "BAD METHOD"`},
		{"the dispatcher gone", func(tb testing.TB) { d.Kill(); d.AdminDo(tb, http.MethodGet, "/healthz", "", nil) },
			"GET /healthz: Get \"http://" + d.Admin + "/healthz\": dial tcp " + d.Admin + ": connect: connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			r.do(func() { tc.call(r) })
			if !r.fatal || len(r.errs) != 1 || !strings.HasPrefix(r.errs[0], tc.want) {
				t.Errorf("failures %q, want one starting %q", r.errs, tc.want)
			}
		})
	}
}

// takenPortBin is a stand-in for bin that, its first fails times, exits as
// a dispatcher does when a port is taken, and then runs bin; attempts
// counts its runs.
func takenPortBin(t *testing.T, bin string, fails int) (path string, attempts func() int) {
	dir := t.TempDir()
	log := filepath.Join(dir, "attempts")
	path = filepath.Join(dir, "tiergate")
	script := fmt.Sprintf(`#!/bin/sh
echo run >> %[1]q
if [ "$(wc -l < %[1]q)" -le %[2]d ]; then
  echo 'dispatcher failed: admin port: listen tcp 127.0.0.1:1: bind: address already in use' >&2
  exit 1
fi
exec %[3]q "$@"
`, log, fails, bin)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "run\n")
	}
}

// A port it picked that another process took meanwhile: StartDispatcher
// starts the dispatcher again on new ports, up to three times; ports the
// caller chose are not changed.
func TestDispatcherRetriesATakenPort(t *testing.T) {
	bins := binaries(t)
	t.Run("taken twice, then free", func(t *testing.T) {
		bin, attempts := takenPortBin(t, bins.Tiergate, 2)
		d := StartDispatcher(t, bin, DispatcherOptions{})
		if code, _ := d.AdminDo(t, http.MethodGet, "/healthz", "", nil); code != http.StatusOK || attempts() != 3 {
			t.Errorf("healthz %d after %d attempts, want 200 after 3", code, attempts())
		}
	})
	for name, tc := range map[string]struct {
		fails, attempts int
		opts            DispatcherOptions
	}{
		"taken three times":       {fails: 3, attempts: 3},
		"a port the caller chose": {fails: 1, attempts: 1, opts: DispatcherOptions{Admin: FreeAddr(t, "127.0.0.1"), Data: FreeAddr(t, "127.0.0.1")}},
	} {
		t.Run(name, func(t *testing.T) {
			bin, attempts := takenPortBin(t, bins.Tiergate, tc.fails)
			r := &recorder{TB: t}
			r.do(func() { StartDispatcher(r, bin, tc.opts) })
			r.runCleanups()
			want := " exited while starting (exit status 1):\ndispatcher failed: admin port: listen tcp 127.0.0.1:1: bind: address already in use\n"
			if !r.fatal || len(r.errs) != 1 || !strings.Contains(r.errs[0], want) || attempts() != tc.attempts {
				t.Errorf("failures %q after %d attempts, want one with %q after %d", r.errs, attempts(), want, tc.attempts)
			}
		})
	}
}
