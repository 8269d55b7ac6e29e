package controllers

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/jwttest"
)

// idp is an HTTPS JWKS endpoint whose answer a test swaps.
type idp struct {
	*httptest.Server
	mu      sync.Mutex
	status  int
	doc     []byte
	fetches atomic.Int32
}

func newIDP(t *testing.T, doc []byte) *idp {
	i := &idp{status: http.StatusOK, doc: doc}
	i.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i.fetches.Add(1)
		i.mu.Lock()
		defer i.mu.Unlock()
		w.WriteHeader(i.status)
		_, _ = w.Write(i.doc)
	}))
	t.Cleanup(i.Close)
	return i
}

func (i *idp) serve(status int, doc []byte) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.status, i.doc = status, doc
}

// fetcherRig runs a JWKSFetcher on a fake clock and hears its notices.
type fetcherRig struct {
	f      *JWKSFetcher
	clk    *clocktesting.FakeClock
	notes  chan types.NamespacedName
	cancel context.CancelFunc
	done   chan struct{}
}

func startFetcher(t *testing.T, opts JWKSFetcherOptions) *fetcherRig {
	t.Helper()
	r := &fetcherRig{clk: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), notes: make(chan types.NamespacedName, 16), done: make(chan struct{})}
	opts.Clock = r.clk
	opts.Notify = func(p types.NamespacedName) { r.notes <- p }
	f, err := NewJWKSFetcher(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.f = f
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); _ = f.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// notified waits for the fetcher's notice after a fetch.
func (r *fetcherRig) notified(t *testing.T) {
	t.Helper()
	select {
	case <-r.notes:
	case <-time.After(10 * time.Second):
		t.Fatal("no fetch was recorded")
	}
}

// step moves the clock once the fetcher waits on a timer.
func (r *fetcherRig) step(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !r.clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the fetcher armed no timer")
		}
		time.Sleep(time.Millisecond)
	}
	r.clk.Step(d)
}

// due is when the pool's next fetch may start.
func (r *fetcherRig) due(pool types.NamespacedName) time.Time {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.sources[pool].due
}

func kids(s JWKSState) string {
	if s.Keys == nil {
		return "<none>"
	}
	var out []string
	for _, k := range s.Keys.Keys {
		out = append(out, k.Kid)
	}
	return strings.Join(out, ",")
}

// The life of one URL: the first fetch, a refetch for an unknown key ID
// no sooner than MinRefetch after the last fetch, one refetch only per
// unknown key ID, the last good keys kept through a failure, and the
// refresh interval.
func TestJWKSFetcher(t *testing.T) {
	k1 := jwttest.NewKey(t, policy.AlgES256, "k1")
	k2 := jwttest.NewKey(t, policy.AlgEdDSA, "k2")
	srv := newIDP(t, jwksDoc(t, k1.JWK))
	r := startFetcher(t, withTransport(DefaultConfig().jwksOptions(), srv.Client().Transport))
	pool := types.NamespacedName{Namespace: "ns", Name: "llm"}
	url := srv.URL + "/jwks.json"
	t0 := r.clk.Now()

	if got := r.f.Watch(pool, url, 10*time.Minute, nil); got.Keys != nil || got.Err != nil {
		t.Fatalf("before the first fetch: %+v", got)
	}
	r.notified(t)
	if got := r.f.Watch(pool, url, 10*time.Minute, nil); kids(got) != "k1" || got.Err != nil {
		t.Fatalf("after the first fetch: keys %s, err %v", kids(got), got.Err)
	}

	// A dispatcher saw k2: refetch at t0+30s, not before.
	srv.serve(http.StatusOK, jwksDoc(t, k1.JWK, k2.JWK))
	r.f.Watch(pool, url, 10*time.Minute, []string{"k1", "k2"})
	if due := r.due(pool); !due.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("refetch due at %s, want t0+30s", due.Sub(t0))
	}
	r.step(t, 30*time.Second)
	r.notified(t)
	if got := r.f.Watch(pool, url, 10*time.Minute, []string{"k2"}); kids(got) != "k1,k2" || srv.fetches.Load() != 2 {
		t.Fatalf("after the refetch: keys %s, %d fetches", kids(got), srv.fetches.Load())
	}
	if due := r.due(pool); !due.Equal(t0.Add(30*time.Second + 10*time.Minute)) {
		t.Fatalf("next refresh due at %s, want t0+10m30s", due.Sub(t0))
	}

	// A made-up key ID asks for one refetch, and only one.
	r.f.Watch(pool, url, 10*time.Minute, []string{"junk"})
	r.step(t, 30*time.Second)
	r.notified(t)
	r.f.Watch(pool, url, 10*time.Minute, []string{"junk"})
	if due := r.due(pool); !due.Equal(t0.Add(60*time.Second + 10*time.Minute)) {
		t.Fatalf("a key ID already tried moved the next fetch to %s", due.Sub(t0))
	}

	// A failed refresh keeps the keys and is retried after MinRefetch.
	srv.serve(http.StatusInternalServerError, []byte("down"))
	r.step(t, 10*time.Minute)
	r.notified(t)
	got := r.f.Watch(pool, url, 10*time.Minute, nil)
	if kids(got) != "k1,k2" || got.Err == nil || got.Err.Error() != srv.URL+"/jwks.json answered 500 Internal Server Error" {
		t.Fatalf("after a failure: keys %s, err %v", kids(got), got.Err)
	}
	if due := r.due(pool); !due.Equal(t0.Add(90*time.Second + 10*time.Minute)) {
		t.Fatalf("retry due at %s, want 30s after the failure", due.Sub(t0))
	}
	if n := srv.fetches.Load(); n != 4 {
		t.Errorf("%d fetches, want 4", n)
	}
}

func TestJWKSFetchRefusals(t *testing.T) {
	k1 := jwttest.NewKey(t, policy.AlgES256, "k1")
	big := append([]byte(`{"keys":[],"pad":"`), make([]byte, maxJWKSBytes)...)
	tests := map[string]struct {
		handler http.HandlerFunc
		want    string // the error after the server's URL
	}{
		"too large": {func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(big) }, "the JWKS is larger than 1 MiB"},
		"not a JWKS": {func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>")) },
			"invalid JWKS: not a JSON Web Key Set: invalid character '<' looking for beginning of value"},
		"a private key": {func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"keys":[{"kty":"EC","crv":"P-256","x":"` + k1.JWK.X + `","y":"` + k1.JWK.Y + `","d":"AA"}]}`))
		}, "invalid JWKS: keys[0] holds private key material (d); publish only the public keys"},
		"a redirect to http": {func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:1/jwks", http.StatusFound)
		},
			`Get "http://127.0.0.1:1/jwks": redirect to http://127.0.0.1:1/jwks refused: a JWKS is fetched over https only, within 5 redirects`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewTLSServer(tc.handler)
			defer srv.Close()
			f, err := NewJWKSFetcher(withTransport(DefaultConfig().jwksOptions(), srv.Client().Transport))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = f.fetch(context.Background(), srv.URL)
			if err == nil || err.Error() != tc.want {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// --jwks-ca-file makes a server signed by that CA trusted; without it the
// same server is refused.
func TestJWKSCAFile(t *testing.T) {
	k1 := jwttest.NewKey(t, policy.AlgES256, "k1")
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(jwksDoc(t, k1.JWK)) }))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	trusting, err := NewJWKSFetcher(withCAFile(ca))
	if err != nil {
		t.Fatal(err)
	}
	if keys, _, err := trusting.fetch(context.Background(), srv.URL); err != nil || len(keys.Keys) != 1 {
		t.Fatalf("with the CA file: %v", err)
	}
	plain, err := NewJWKSFetcher(DefaultConfig().jwksOptions())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.fetch(context.Background(), srv.URL); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("without the CA file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	_ = os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := NewJWKSFetcher(withCAFile(bad)); err == nil || err.Error() != "invalid controller options: the JWKS CA file "+bad+" holds no PEM certificate" {
		t.Fatalf("a bad CA file: %v", err)
	}
}

// The reconciler registers a pool's URL with the fetcher, and forgets it
// once the pool takes its keys from elsewhere.
func TestReconcilerRegistersURLs(t *testing.T) {
	f, err := NewJWKSFetcher(DefaultConfig().jwksOptions())
	if err != nil {
		t.Fatal(err)
	}
	registered := func() []string {
		f.mu.Lock()
		defer f.mu.Unlock()
		var out []string
		for _, s := range f.sources {
			out = append(out, s.url)
		}
		return out
	}
	ctx := context.Background()
	t.Cleanup(func() { forgetPoolMetrics(seedKey.String()) })
	c := newFakeClient(t, jwtPool(v1alpha1.JWKSSource{URL: "https://idp.test/jwks"}), interceptor.Funcs{})
	r := &PoolReconciler{Client: c, Pusher: &fakePusher{}, JWKS: f, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
		t.Fatal(err)
	}
	if got := registered(); len(got) != 1 || got[0] != "https://idp.test/jwks" {
		t.Fatalf("registered %v", got)
	}
	var pool v1alpha1.ModelPool
	if err := c.Get(ctx, seedKey, &pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Authentication.JWT.JWKS = v1alpha1.JWKSSource{SecretRef: &v1alpha1.JWKSKeyRef{Name: "jwks", Key: "jwks.json"}}
	if err := c.Update(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey}); err != nil {
		t.Fatal(err)
	}
	if got := registered(); len(got) != 0 {
		t.Fatalf("still registered %v", got)
	}
}

func withTransport(o JWKSFetcherOptions, tr http.RoundTripper) JWKSFetcherOptions {
	o.Transport = tr
	return o
}

func withCAFile(path string) JWKSFetcherOptions {
	c := DefaultConfig()
	c.JWKSCAFile = path
	return c.jwksOptions()
}
