package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

const (
	// defaultJWKSRefresh is a pool's refresh interval when its spec names
	// none (the CRD's default).
	defaultJWKSRefresh = 10 * time.Minute
	maxJWKSBytes       = 1 << 20
)

// JWKSFetcherOptions configures a JWKSFetcher. Config.jwksOptions derives
// them from the controller's configuration; nothing here has a default.
type JWKSFetcherOptions struct {
	// MinRefetch is the shortest time between two fetches of one URL that
	// a dispatcher's unknown key ID or a failure asks for: tokens naming
	// made-up key IDs cannot make the controller hammer the identity
	// provider.
	MinRefetch time.Duration
	// Timeout bounds one fetch.
	Timeout time.Duration
	// CAFile, when set, is a PEM bundle trusted besides the system roots.
	CAFile string
	// Transport overrides the HTTP transport (tests).
	Transport http.RoundTripper
	Clock     clock.WithTicker
	// Notify, when set, is called with a pool whose key set or fetch error
	// changed.
	Notify func(types.NamespacedName)
	Log    logr.Logger
}

func (o JWKSFetcherOptions) validate() error {
	switch {
	case o.MinRefetch <= 0 || o.Timeout <= 0:
		return fmt.Errorf("%w: JWKS min refetch %s and timeout %s must be positive", ErrInvalidOptions, o.MinRefetch, o.Timeout)
	case o.Clock == nil:
		return fmt.Errorf("%w: the JWKS fetcher needs a clock", ErrInvalidOptions)
	}
	return nil
}

// JWKSFetcher keeps the key sets of the pools whose JWKS comes from an
// HTTPS URL: it fetches each when a pool first asks, every refresh
// interval, after a failure, and when a dispatcher reports a key ID the
// set lacks, never twice within MinRefetch. The last good set stays when a
// fetch fails. It is a manager Runnable: it fetches only on the leader.
type JWKSFetcher struct {
	opts   JWKSFetcherOptions
	client *http.Client

	mu      sync.Mutex
	sources map[types.NamespacedName]*jwksSource
	wake    chan struct{}
}

// jwksSource is one pool's URL and what its fetches brought.
type jwksSource struct {
	url      string
	interval time.Duration
	keys     *policy.JWKS // last good set; nil before the first success
	skipped  int
	err      error     // of the last attempt
	last     time.Time // start of the last attempt; zero before the first
	due      time.Time // when the next fetch may start
	fetching bool
	// tried are unknown key IDs a refetch was made for; each asks for one
	// refetch only, until the key set changes.
	tried map[string]bool
}

// JWKSState is a pool's key set as the fetcher holds it.
type JWKSState struct {
	Keys    *policy.JWKS // nil before the first successful fetch
	Skipped int          // keys of the document that are not signing keys
	Err     error        // of the last fetch, nil when it succeeded
}

// NewJWKSFetcher returns a fetcher; call Start (the manager does) to run it.
func NewJWKSFetcher(opts JWKSFetcherOptions) (*JWKSFetcher, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Notify == nil {
		opts.Notify = func(types.NamespacedName) {}
	}
	if opts.Transport == nil {
		tr, err := jwksTransport(opts.CAFile, opts.Timeout)
		if err != nil {
			return nil, err
		}
		opts.Transport = tr
	}
	return &JWKSFetcher{
		opts: opts,
		client: &http.Client{Transport: opts.Transport, Timeout: opts.Timeout, CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" || len(via) >= 5 {
				return fmt.Errorf("redirect to %s refused: a JWKS is fetched over https only, within 5 redirects", req.URL.Redacted())
			}
			return nil
		}},
		sources: map[types.NamespacedName]*jwksSource{},
		wake:    make(chan struct{}, 1),
	}, nil
}

// jwksTransport trusts the system roots and, when caFile is set, its
// certificates too.
func jwksTransport(caFile string, timeout time.Duration) (*http.Transport, error) {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
		TLSHandshakeTimeout: timeout,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12},
	}
	if caFile == "" {
		return tr, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the JWKS CA file: %v", ErrInvalidOptions, err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: the JWKS CA file %s holds no PEM certificate", ErrInvalidOptions, caFile)
	}
	tr.TLSClientConfig.RootCAs = roots
	return tr, nil
}

// Watch registers the pool's URL and refresh interval, asks for a refetch
// when unknown names a key ID the set lacks, and returns what is held. A
// new URL drops the old URL's keys.
func (f *JWKSFetcher) Watch(pool types.NamespacedName, url string, interval time.Duration, unknown []string) JWKSState {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.opts.Clock.Now()
	s := f.sources[pool]
	if s == nil || s.url != url {
		s = &jwksSource{url: url, due: now, tried: map[string]bool{}}
		f.sources[pool] = s
		f.kick()
	}
	if s.interval != interval {
		s.interval = interval
		if !s.last.IsZero() {
			s.due = minTime(s.due, s.last.Add(interval))
		}
		f.kick()
	}
	if s.asksRefetch(unknown) {
		s.due = minTime(s.due, maxTime(now, s.last.Add(f.opts.MinRefetch)))
		f.kick()
	}
	return JWKSState{Keys: s.keys, Skipped: s.skipped, Err: s.err}
}

// asksRefetch reports whether unknown holds a key ID that the set lacks
// and that no refetch was made for yet, and notes those as pending.
func (s *jwksSource) asksRefetch(unknown []string) bool {
	held := map[string]bool{}
	if s.keys != nil {
		for _, k := range s.keys.Keys {
			held[k.Kid] = true
		}
	}
	ask := false
	for _, kid := range unknown {
		if kid != "" && !held[kid] && !s.tried[kid] {
			s.tried[kid] = true
			ask = true
		}
	}
	return ask
}

// Forget drops a pool's source.
func (f *JWKSFetcher) Forget(pool types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sources, pool)
}

func (f *JWKSFetcher) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Start fetches due sources until ctx ends.
func (f *JWKSFetcher) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		if !f.wait(ctx, f.startDue(ctx, &wg)) {
			return nil
		}
	}
}

// wait returns after next (0: no timer), on a kick, or false when ctx ends.
func (f *JWKSFetcher) wait(ctx context.Context, next time.Duration) bool {
	var fire <-chan time.Time
	if next > 0 {
		t := f.opts.Clock.NewTimer(next)
		defer t.Stop()
		fire = t.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-f.wake:
	case <-fire:
	}
	return true
}

// startDue starts a fetch for every due source and returns how long until
// the next one is due (0: none is).
func (f *JWKSFetcher) startDue(ctx context.Context, wg *sync.WaitGroup) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.opts.Clock.Now()
	var next time.Duration
	for pool, s := range f.sources {
		if s.fetching {
			continue
		}
		if wait := s.due.Sub(now); wait > 0 {
			if next == 0 || wait < next {
				next = wait
			}
			continue
		}
		s.fetching, s.last = true, now
		wg.Add(1)
		go func(pool types.NamespacedName, s *jwksSource, url string) {
			defer wg.Done()
			keys, skipped, err := f.fetch(ctx, url)
			f.record(pool, s, keys, skipped, err)
		}(pool, s, s.url)
	}
	return next
}

// record folds a fetch into its source and notifies the pool.
func (f *JWKSFetcher) record(pool types.NamespacedName, s *jwksSource, keys *policy.JWKS, skipped int, err error) {
	f.mu.Lock()
	s.fetching = false
	if f.sources[pool] != s {
		f.mu.Unlock()
		return // forgotten or replaced meanwhile
	}
	if err != nil {
		s.err = err
		s.due = s.last.Add(min(f.opts.MinRefetch, s.interval))
		f.opts.Log.Info("JWKS fetch failed", "pool", pool.String(), "url", s.url, "error", err.Error())
	} else {
		if !jwksEqual(s.keys, keys) {
			s.tried = map[string]bool{}
		}
		s.keys, s.skipped, s.err = keys, skipped, nil
		s.due = s.last.Add(s.interval)
		f.opts.Log.V(1).Info("JWKS fetched", "pool", pool.String(), "url", s.url, "keys", len(keys.Keys))
	}
	f.mu.Unlock()
	f.kick()
	f.opts.Notify(pool)
}

// fetch GETs url and decodes its JWKS.
func (f *JWKSFetcher) fetch(ctx context.Context, url string) (*policy.JWKS, int, error) {
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json, application/jwk-set+json")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("%s answered %s", req.URL.Redacted(), resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, 0, err
	}
	if len(body) > maxJWKSBytes {
		return nil, 0, errors.New("the JWKS is larger than 1 MiB")
	}
	return DecodeJWKS(body)
}

func jwksEqual(a, b *policy.JWKS) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(a.Keys, b.Keys)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
