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
	"sync"
	"sync/atomic"

	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/metrics"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// exchange is one request's state: the writer that captures its status,
// its labels, and what the proxy hooks share. Exchanges are pooled, so the
// data path allocates nothing for them in the steady state.
type exchange struct {
	sw         statusWriter
	pool, tier string
	st         *state // the policy the request started under

	backend     *balancer.Backend // of the attempt in progress
	id          *identity.Identifier
	tenant      string
	status      int  // the backend's status, once it answered
	failed      bool // the backend failed before answering
	unreachable bool // ... and the reason was that its connection failed
	retryable   bool // a connection failure may still be retried elsewhere
	served      bool // a 2xx answer, read to its end
}

var exchanges = sync.Pool{New: func() any { return new(exchange) }}

func getExchange(w http.ResponseWriter, draining *atomic.Bool) *exchange {
	x := exchanges.Get().(*exchange)
	x.sw.ResponseWriter = w
	x.sw.draining = draining
	return x
}

// series is the metric series of the exchange's pool and tier, or nil when
// the policy it started under has no such tier (or there was none).
func (x *exchange) series() *metrics.Series {
	if x.st == nil || x.st.pool != x.pool {
		return nil
	}
	return x.st.series[x.tier]
}

func putExchange(x *exchange) {
	*x = exchange{}
	exchanges.Put(x)
}

// statusWriter passes a response through and remembers its status. It
// flushes directly (http.Flusher, and FlushError for
// http.ResponseController), so SSE is still flushed per event; read
// deadlines and hijacking reach the server's writer through Unwrap.
type statusWriter struct {
	http.ResponseWriter
	// code is the final status written, or an outcome the data path set
	// (statusClientClosed, or 502 for a stream cut by the backend).
	code int
	// draining is the server's: from the drain on, every response says
	// Connection: close, so pooled clients reconnect (elsewhere) instead
	// of reusing a connection to a dispatcher that is going away.
	draining *atomic.Bool
}

// WriteHeader records the first final status; 1xx answers other than 101
// are informational and may precede it.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
		if code != http.StatusSwitchingProtocols {
			w.closeIfDraining()
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
		w.closeIfDraining()
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) closeIfDraining() {
	if w.draining != nil && w.draining.Load() {
		w.Header().Set("Connection", "close")
	}
}

// Flush sends what is buffered, and the headers with status 200 if none
// was written yet.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush with the error of the server's writer.
func (w *statusWriter) FlushError() error {
	if w.code == 0 {
		w.code = http.StatusOK
		w.closeIfDraining()
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap gives http.ResponseController the server's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// status is the requests_total code: net/http sends 200 for a handler
// that wrote nothing.
func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// bodyReader is a request body read from memory: one allocation where
// io.NopCloser(bytes.NewReader(b)) takes two.
type bodyReader struct{ bytes.Reader }

func newBodyReader(b []byte) *bodyReader {
	r := &bodyReader{}
	r.Reset(b)
	return r
}

func (*bodyReader) Close() error { return nil }

type exchangeKey struct{}

func rewrite(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(exchangeKey{}).(*exchange)
	pr.SetURL(x.backend.URL)
	x.id.Strip(pr.Out.Header, x.tenant)
}

func modifyResponse(resp *http.Response) error {
	if x, ok := resp.Request.Context().Value(exchangeKey{}).(*exchange); ok {
		x.status = resp.StatusCode
	}
	return nil
}

// proxyError runs when the backend could not be reached or failed before
// sending its headers. A connection that failed sent nothing, so, once,
// nothing is written and forward retries on another backend.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	x := r.Context().Value(exchangeKey{}).(*exchange)
	if r.Context().Err() != nil {
		return // the client left: nobody to answer
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		x.unreachable = true
		if x.retryable {
			s.cfg.Log.V(1).Info("backend unreachable", "backend", x.backend.Address, "err", err.Error())
			return
		}
	}
	x.failed = true
	s.cfg.Log.V(1).Info("backend failed", "backend", x.backend.Address, "err", err.Error())
	apierror.BackendError(x.tier).Write(w)
}

// forward proxies the request to a backend, and once more to another one
// if the first could not be connected to. Both attempts are inside the
// caller's slot.
func (s *Server) forward(x *exchange, r *http.Request, st *state, who identity.Identity, body []byte) {
	p, ok := s.bal.Pick(nil)
	if !ok {
		s.refuse(x, apierror.NoBackend(who.Tier))
		return
	}
	x.id, x.tenant = st.id, who.Tenant
	// A body the proxy reads from the client cannot be sent twice.
	x.retryable = body != nil || r.ContentLength == 0
	out := r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x))
	if s.attempt(x, r, out, p, body) {
		x.retryable = false
		if p2, ok := s.bal.Pick(p.Backend); ok {
			s.attempt(x, r, out, p2, body)
		} else {
			x.failed = true
			apierror.BackendError(x.tier).Write(&x.sw)
		}
	}
	switch {
	case x.failed:
		s.reject(x, queue.CauseBackendError)
	case x.status == 0:
		// The client left before the backend answered.
		s.clientGone(x, metrics.StageInflight)
	case x.sw.code == 0:
		// An upgrade: the proxy hijacked the connection and wrote the
		// backend's 101 itself.
		x.sw.code = x.status
	}
	x.served = !x.failed && x.status >= 200 && x.status < 300
}

// attempt proxies out to p's backend once and ends p with what it learnt
// of the backend. It reports whether the request may be retried on
// another backend: the connection failed before anything was sent.
func (s *Server) attempt(x *exchange, r, out *http.Request, p balancer.Picked, body []byte) (retry bool) {
	x.backend, x.status, x.failed, x.unreachable = p.Backend, 0, false, false
	if body != nil {
		out.Body = newBodyReader(body)
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return newBodyReader(body), nil }
		if len(body) == 0 {
			out.Body = http.NoBody
		}
	}
	completed := false
	defer func() {
		if completed {
			return
		}
		v := recover()
		outcome := balancer.Failed // the backend cut its response
		if r.Context().Err() != nil {
			outcome = balancer.Unknown
		}
		s.done(x, p, outcome)
		s.aborted(x, r, v)
	}()
	s.proxy.ServeHTTP(&x.sw, out)
	completed = true
	var outcome balancer.Outcome
	switch {
	case x.unreachable:
		outcome = balancer.Unreachable
	case x.failed || x.status >= 500:
		outcome = balancer.Failed
	case x.status == 0:
		outcome = balancer.Unknown
	default:
		outcome = balancer.Answered
	}
	s.done(x, p, outcome)
	return x.unreachable && !x.failed
}

// done ends p with outcome and logs what it did to the backend's health.
func (s *Server) done(x *exchange, p balancer.Picked, o balancer.Outcome) {
	c := s.bal.Done(p, o)
	switch {
	case c.Ejected > 0:
		s.cfg.Log.Info("backend ejected", "pool", x.pool, "backend", p.Address, "for", c.Ejected.String(), "ejections", p.Ejections())
	case c.Restored:
		s.cfg.Log.Info("backend restored", "pool", x.pool, "backend", p.Address)
	}
}

// aborted records a response the proxy cut when the copy failed, and
// re-panics with v: the client left mid-generation (the upstream request
// is cancelled with it) or the backend died mid-stream (the client sees a
// cut stream).
func (s *Server) aborted(x *exchange, r *http.Request, v any) {
	if r.Context().Err() != nil {
		s.clientGone(x, metrics.StageInflight)
	} else {
		x.sw.code = http.StatusBadGateway
		s.cfg.Log.V(1).Info("stream aborted", "backend", x.backend.Address, "panic", fmt.Sprint(v))
	}
	if v != nil {
		panic(v)
	}
}

// forwardExempt proxies an exempt path without queueing.
func (s *Server) forwardExempt(x *exchange, r *http.Request, st *state, who identity.Identity) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		s.refuse(x, apierror.BodyTooLarge(s.cfg.MaxBodyBytes))
		return
	}
	r.Body = http.MaxBytesReader(x.sw.ResponseWriter, r.Body, s.cfg.MaxBodyBytes)
	s.forward(x, r, st, who, nil)
}
