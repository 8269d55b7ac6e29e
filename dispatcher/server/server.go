package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/policy"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// StatusClientClosed is the requests_total code of a request whose client
// went away before it was answered (nginx's convention).
const StatusClientClosed = 499

// Config tunes the data path.
type Config struct {
	// MaxBodyBytes bounds a request body; larger gets 413.
	MaxBodyBytes int64
	// BodyTimeout bounds the time to receive a body; slower gets 408.
	BodyTimeout time.Duration
	// Transport reaches the backends; nil builds a pooled http.Transport.
	Transport http.RoundTripper
	Log       logr.Logger
}

// Defaults of Config.
const (
	DefaultMaxBodyBytes = 4 << 20
	DefaultBodyTimeout  = 30 * time.Second
)

func (c *Config) validate() error {
	if c.MaxBodyBytes <= 0 {
		return fmt.Errorf("server: MaxBodyBytes must be > 0, got %d", c.MaxBodyBytes)
	}
	if c.BodyTimeout <= 0 {
		return fmt.Errorf("server: BodyTimeout must be > 0, got %s", c.BodyTimeout)
	}
	return nil
}

// state is what the data path needs from one policy.
type state struct {
	pool          string
	id            *identity.Identifier
	exempt        map[string]bool
	tierWait      map[string]time.Duration
	clientTimeout time.Duration
}

// Server is the data-port handler.
type Server struct {
	cfg      Config
	q        *queue.Queue
	bal      *balancer.Balancer
	m        *metrics.Metrics
	proxy    *httputil.ReverseProxy
	cur      atomic.Pointer[state]
	draining atomic.Bool
	active   atomic.Int64
	idle     chan struct{} // signalled when active drops to 0
}

// New builds the data path. It serves 503 until SetPolicy.
func New(cfg Config, q *queue.Queue, bal *balancer.Balancer, m *metrics.Metrics) (*Server, error) {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	s := &Server{cfg: cfg, q: q, bal: bal, m: m, idle: make(chan struct{}, 1)}
	s.proxy = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      cfg.Transport,
		ModifyResponse: modifyResponse,
		ErrorHandler:   s.proxyError,
		ErrorLog:       newStdLogger(cfg.Log.V(1)),
		BufferPool:     bufferPool{},
	}
	return s, nil
}

// NewTransport is the backend transport: pooled keep-alive connections, no
// response timeout (a generation may take minutes), compression passed
// through untouched.
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}

// SetPolicy switches the data path to p (already validated). The caller
// updates the queue and balancer first, so a tier this policy introduces is
// known to the queue before any request names it.
func (s *Server) SetPolicy(p *policy.Policy) {
	st := &state{
		pool:          p.Pool,
		id:            identity.New(p),
		exempt:        make(map[string]bool, len(p.ExemptPaths)),
		tierWait:      make(map[string]time.Duration, len(p.Tiers)),
		clientTimeout: time.Duration(p.ClientTimeoutSeconds * float64(time.Second)),
	}
	for _, e := range p.ExemptPaths {
		st.exempt[e] = true
	}
	for _, t := range p.Tiers {
		st.tierWait[t.Name] = time.Duration(t.TolerableWaitSeconds * float64(time.Second))
	}
	s.cur.Store(st)
}

// StartDrain makes every new request get 503 draining.
func (s *Server) StartDrain() { s.draining.Store(true) }

// Draining says whether StartDrain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// Active is the number of requests inside the handler.
func (s *Server) Active() int64 { return s.active.Load() }

// WaitIdle returns once no request is inside the handler, or ctx ends.
func (s *Server) WaitIdle(ctx context.Context) error {
	for s.active.Load() > 0 {
		select {
		case <-s.idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (s *Server) leave() {
	if s.active.Add(-1) == 0 {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// ServeHTTP is the data path.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.active.Add(1)
	defer s.leave()
	if s.draining.Load() {
		s.refuse(w, "", "", apierror.Draining())
		return
	}
	st := s.cur.Load()
	if st == nil {
		s.refuse(w, "", "", apierror.NoPolicy())
		return
	}
	who, err := st.id.Identify(r.Header)
	if err != nil {
		s.refuse(w, st.pool, who.Tier, identityError(err, who.Tenant))
		return
	}
	if st.exempt[r.URL.Path] {
		s.forwardExempt(w, r, st, who)
		return
	}

	body, aerr := s.readBody(w, r)
	if aerr != nil {
		s.refuse(w, st.pool, who.Tier, aerr)
		return
	}
	if body == nil {
		s.clientGone(st.pool, who.Tier, "")
		return
	}

	h, err := s.q.Admit(who.Tenant, who.Tier)
	if err != nil {
		s.refuse(w, st.pool, who.Tier, apierror.FromQueue(err, who.Tenant, who.Tier, st.tierWait[who.Tier], st.clientTimeout))
		return
	}
	if err := h.Wait(r.Context()); err != nil {
		if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
			s.clientGone(st.pool, who.Tier, metrics.StageQueued)
			return
		}
		s.refuse(w, st.pool, who.Tier, apierror.FromQueue(err, who.Tenant, who.Tier, st.tierWait[who.Tier], st.clientTimeout))
		return
	}
	dispatched := time.Now()
	defer func() {
		h.Release()
		s.m.ObserveService(st.pool, who.Tier, time.Since(dispatched))
	}()
	waited := h.Waited()
	s.m.ObserveWait(st.pool, who.Tier, waited)
	if r.Context().Err() != nil {
		s.clientGone(st.pool, who.Tier, metrics.StageDispatch)
		return
	}
	w.Header().Set(apierror.HeaderQueueWaitMs, strconv.FormatInt(waited.Milliseconds(), 10))
	s.forward(w, r, st, who, body)
}

// identityError maps identity's sentinels to refusals.
func identityError(err error, tenant string) *apierror.Error {
	msg := err.Error()
	switch {
	case errors.Is(err, identity.ErrUnknownTenant):
		return apierror.UnknownTenant(tenant)
	case errors.Is(err, identity.ErrMalformed):
		return apierror.BadRequest(strings.TrimPrefix(msg, identity.ErrMalformed.Error()+": "))
	default:
		return apierror.Unauthenticated(strings.TrimPrefix(msg, identity.ErrUnauthenticated.Error()+": "))
	}
}

func (s *Server) refuse(w http.ResponseWriter, pool, tier string, e *apierror.Error) {
	if e.Tier == "" {
		e.Tier = tier // known once the caller is identified
	}
	e.Write(w)
	s.m.Reject(pool, tier, e.Type)
	s.m.Request(pool, tier, e.Status)
}

// clientGone counts a request whose client left; stage "" when it left
// before admission (nothing to abandon).
func (s *Server) clientGone(pool, tier, stage string) {
	if stage != "" {
		s.m.Abandon(pool, tier, stage)
	}
	s.m.Request(pool, tier, StatusClientClosed)
}

// readBody reads the whole body. It returns (nil, nil) when the client went
// away while sending it.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apierror.Error) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		w.Header().Set("Connection", "close")
		return nil, apierror.BodyTooLarge(s.cfg.MaxBodyBytes)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	// Reading to EOF also starts net/http's watch for the client closing
	// the connection, which Wait relies on while the request is queued.
	body, err := readAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength)
	if err != nil {
		// Leave the read deadline as it is and close the connection: what
		// is left of this body is not worth waiting for.
		w.Header().Set("Connection", "close")
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, apierror.BodyTooLarge(s.cfg.MaxBodyBytes)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, apierror.RequestTimeout(s.cfg.BodyTimeout)
		case r.Context().Err() != nil:
			return nil, nil
		default:
			return nil, apierror.BadRequest("could not read the request body: " + err.Error())
		}
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, nil
}

// readAll reads r to EOF. With a known length it allocates exactly that
// much: a queued request keeps its body, so slack would be paid per
// queued request. It never returns a nil slice without an error.
func readAll(r io.Reader, length int64) ([]byte, error) {
	if length < 0 {
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(r); err != nil {
			return nil, err
		}
		return append([]byte{}, buf.Bytes()...), nil
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("the body ended before its Content-Length: %w", err)
		}
		return nil, err
	}
	var probe [1]byte
	if n, err := r.Read(probe[:]); n > 0 || (err != nil && !errors.Is(err, io.EOF)) {
		if err == nil {
			err = errors.New("the body is longer than its Content-Length")
		}
		return nil, err
	}
	return body, nil
}

// proxied is the per-request state the proxy hooks share.
type proxied struct {
	backend *balancer.Backend
	id      *identity.Identifier
	tenant  string
	tier    string
	status  int
	failed  bool // the backend failed before answering
}

type proxiedKey struct{}

func rewrite(pr *httputil.ProxyRequest) {
	p := pr.In.Context().Value(proxiedKey{}).(*proxied)
	pr.SetURL(p.backend.URL)
	p.id.Strip(pr.Out.Header, p.tenant)
}

func modifyResponse(resp *http.Response) error {
	if p, ok := resp.Request.Context().Value(proxiedKey{}).(*proxied); ok {
		p.status = resp.StatusCode
	}
	return nil
}

// proxyError runs when the backend could not be reached or failed before
// sending its headers.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	p := r.Context().Value(proxiedKey{}).(*proxied)
	if r.Context().Err() != nil {
		return // the client left: nobody to answer
	}
	p.failed = true
	s.cfg.Log.V(1).Info("backend failed", "backend", p.backend.Address, "err", err.Error())
	apierror.BackendError(p.tier).Write(w)
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, st *state, who identity.Identity, body []byte) {
	be, ok := s.bal.Pick()
	if !ok {
		s.refuse(w, st.pool, who.Tier, apierror.NoBackend(who.Tier))
		return
	}
	defer be.Done()
	p := &proxied{backend: be, id: st.id, tenant: who.Tenant, tier: who.Tier}
	out := r.WithContext(context.WithValue(r.Context(), proxiedKey{}, p))
	if body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		if len(body) == 0 {
			out.Body = http.NoBody
		}
	}
	completed := false
	defer func() {
		if completed {
			return
		}
		// The proxy aborts the response when the copy fails: the client left
		// mid-generation (the upstream request is cancelled with it) or the
		// backend died mid-stream (the client sees a cut stream).
		v := recover()
		if r.Context().Err() != nil {
			s.clientGone(st.pool, who.Tier, metrics.StageInflight)
		} else {
			s.m.Request(st.pool, who.Tier, http.StatusBadGateway)
			s.cfg.Log.V(1).Info("stream aborted", "backend", be.Address, "panic", fmt.Sprint(v))
		}
		if v != nil {
			panic(v)
		}
	}()
	s.proxy.ServeHTTP(w, out)
	completed = true
	switch {
	case p.failed:
		s.m.Reject(st.pool, who.Tier, apierror.TypeBackendError)
		s.m.Request(st.pool, who.Tier, http.StatusBadGateway)
	case p.status == 0:
		// The client left before the backend answered.
		s.clientGone(st.pool, who.Tier, metrics.StageInflight)
	default:
		s.m.Request(st.pool, who.Tier, p.status)
	}
}

// forwardExempt proxies an exempt path without queueing.
func (s *Server) forwardExempt(w http.ResponseWriter, r *http.Request, st *state, who identity.Identity) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		s.refuse(w, st.pool, who.Tier, apierror.BodyTooLarge(s.cfg.MaxBodyBytes))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	s.forward(w, r, st, who, nil)
}
