package testutil

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// DispatcherToken is the admin token of a StartDispatcher whose options
// name none.
const DispatcherToken = "testutil-admin-token"

// DispatcherOptions say how StartDispatcher runs `tiergate dispatcher`.
type DispatcherOptions struct {
	// Options name the process and say how Cleanup ends it; the default
	// name is "dispatcher".
	Options
	// Data and Admin are --listen and --admin-listen; the defaults are free
	// ports on 127.0.0.1.
	Data, Admin string
	// TokenFile is --admin-token-file. Without it, Token (default
	// DispatcherToken) is written to a file of the test's.
	TokenFile, Token string
	// NoToken leaves --admin-token-file out: the admin API is closed.
	NoToken bool
	// Policy, when not nil, is written as JSON to --policy-file.
	Policy any
	// Args are more flags.
	Args []string
	// Env is added to the test's environment.
	Env []string
	// Ready is the admin path that must answer 200 before StartDispatcher
	// returns (default /healthz; /readyz needs a policy), within
	// ReadyTimeout (default 20s).
	Ready        string
	ReadyTimeout time.Duration
}

// Dispatcher is a running `tiergate dispatcher`.
type Dispatcher struct {
	*Process
	// Data and Admin are host:port of its data and admin listeners.
	Data, Admin string
	// Token is its admin token.
	Token string
	// PolicyFile is its --policy-file, "" when it has none.
	PolicyFile string
}

// StartDispatcher starts bin, the tiergate binary, as a dispatcher for t
// and waits until o.Ready answers 200. Cleanup stops it as StartT does.
// Ports it picked itself (o.Data, o.Admin empty) were free a moment
// before, but another package's process may take one first: a dispatcher
// that exits for an address in use is started again on new ones, up to
// three times.
func StartDispatcher(t testing.TB, bin string, o DispatcherOptions) *Dispatcher {
	t.Helper()
	picked := o.Data == "" && o.Admin == ""
	for attempt := 1; ; attempt++ {
		d, err := startDispatcher(t, bin, o)
		if err == nil {
			return d
		}
		if !picked || attempt == 3 || !errors.Is(err, errExitedStarting) || !strings.Contains(d.Output(), "address already in use") {
			t.Fatalf("%v", err)
		}
		t.Logf("dispatcher on %s and %s: an address was taken meanwhile; starting it again on others", d.Data, d.Admin)
	}
}

func startDispatcher(t testing.TB, bin string, o DispatcherOptions) (*Dispatcher, error) {
	t.Helper()
	o.defaults(t)
	d := &Dispatcher{Data: o.Data, Admin: o.Admin, Token: o.Token}
	dir := t.TempDir()
	args := []string{"dispatcher", "--listen", o.Data, "--admin-listen", o.Admin, "--log-format", "text"}
	switch {
	case o.NoToken:
		d.Token = ""
	case o.TokenFile == "":
		o.TokenFile = filepath.Join(dir, "token")
		writeFile(t, o.TokenFile, []byte(o.Token+"\n"))
	default:
		b, err := os.ReadFile(o.TokenFile)
		if err != nil {
			t.Fatalf("reading the admin token: %v", err)
		}
		d.Token = strings.TrimSpace(string(b))
	}
	if !o.NoToken {
		args = append(args, "--admin-token-file", o.TokenFile)
	}
	if o.Policy != nil {
		d.PolicyFile = filepath.Join(dir, "policy.json")
		WritePolicyFile(t, d.PolicyFile, o.Policy)
		args = append(args, "--policy-file", d.PolicyFile)
	}
	cmd := exec.Command(bin, append(args, o.Args...)...)
	if o.Env != nil {
		cmd.Env = append(os.Environ(), o.Env...)
	}
	d.Process = StartT(t, cmd, o.Options)
	return d, awaitHTTP(d.Process, d.AdminURL(o.Ready), http.StatusOK, o.ReadyTimeout)
}

func (o *DispatcherOptions) defaults(t testing.TB) {
	t.Helper()
	if o.Name == "" {
		o.Name = "dispatcher"
	}
	if o.Data == "" {
		o.Data = FreeAddr(t, "127.0.0.1")
	}
	if o.Admin == "" {
		o.Admin = FreeAddr(t, "127.0.0.1")
	}
	if o.Token == "" {
		o.Token = DispatcherToken
	}
	if o.Ready == "" {
		o.Ready = "/healthz"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 20 * time.Second
	}
}

// WritePolicyFile writes p as JSON to path, atomically (a rename), so a
// watching dispatcher never reads half a file.
func WritePolicyFile(t testing.TB, path string, p any) {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("encoding the policy: %v", err)
	}
	writeFile(t, path+".tmp", b)
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatalf("writing the policy: %v", err)
	}
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("writing %s: %v", filepath.Base(path), err)
	}
}

// AdminURL is the admin listener's URL of path.
func (d *Dispatcher) AdminURL(path string) string { return "http://" + d.Admin + path }

// DataURL is the data listener's URL of path.
func (d *Dispatcher) DataURL(path string) string { return "http://" + d.Data + path }

// AdminDo sends one admin request, with token as a Bearer token when it
// is not empty, and returns the status and body.
func (d *Dispatcher) AdminDo(t testing.TB, method, path, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, d.AdminURL(path), bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// PutPolicy sends p, as JSON, to PUT /v1/policy with the admin token.
func (d *Dispatcher) PutPolicy(t testing.TB, p any) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("encoding the policy: %v", err)
	}
	return d.AdminDo(t, http.MethodPut, "/v1/policy", d.Token, b)
}

// MustPutPolicy is PutPolicy that fails t unless the answer is 200.
func (d *Dispatcher) MustPutPolicy(t testing.TB, p any) {
	t.Helper()
	if code, body := d.PutPolicy(t, p); code != http.StatusOK {
		t.Fatalf("PUT /v1/policy: %d %s", code, body)
	}
}

// Stats decodes GET /v1/stats into v (a dispatcher.Stats, or the part of
// it a test reads).
func (d *Dispatcher) Stats(t testing.TB, v any) {
	t.Helper()
	GetJSON(t, d.AdminURL("/v1/stats"), d.Token, v)
}

// Metrics scrapes the admin listener's /metrics (see Scrape).
func (d *Dispatcher) Metrics(t testing.TB) map[string]float64 {
	t.Helper()
	return Scrape(t, d.AdminURL("/metrics"))
}
