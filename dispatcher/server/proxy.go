package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/forward"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/metrics"
)

// exchange is one request's state: the writer that captures its status,
// its labels, and what the proxy hooks share. Exchanges are pooled, so the
// data path allocates nothing for them in the steady state.
type exchange struct {
	sw         statusWriter
	pool, tier string
	st         *state // the policy the request started under

	backend *balancer.Backend // of the attempt in progress
	status  int               // the backend's status, once it answered
	served  bool              // a 2xx answer, read to its end
	tok     tokenReq          // the request's tokens (tokens.go)
}

var exchanges = sync.Pool{New: func() any { return new(exchange) }}

func getExchange(w http.ResponseWriter, draining *atomic.Bool) *exchange {
	x := exchanges.Get().(*exchange)
	x.sw.ResponseWriter = w
	x.sw.draining = draining
	return x
}

func putExchange(x *exchange) {
	spare := x.tok.spare
	*x = exchange{}
	x.tok.spare = spare
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
	// tok, once the request is estimated, gets the final head (its
	// budget's headers) and meters a 2xx answer's body.
	tok *tokenReq
}

// WriteHeader records the first final status; 1xx answers other than 101
// are informational and may precede it.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
		if code != http.StatusSwitchingProtocols {
			w.final()
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
		w.final()
	}
	n, err := w.ResponseWriter.Write(b)
	if w.tok != nil && w.tok.meter != nil {
		_, _ = w.tok.meter.Write(b[:n]) // never fails
	}
	return n, err
}

// final completes the final head (w.code) before it is written.
func (w *statusWriter) final() {
	if w.draining != nil && w.draining.Load() {
		w.Header().Set("Connection", "close")
	}
	if w.tok != nil {
		w.tok.head(w.Header(), w.code)
	}
}

// Flush sends what is buffered, and the headers with status 200 if none
// was written yet.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush with the error of the server's writer.
func (w *statusWriter) FlushError() error {
	if w.code == 0 {
		w.code = http.StatusOK
		w.final()
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

// forward proxies the request to a backend, and once more to another one
// if the first could not be connected to. Both attempts are inside the
// caller's slot.
func (s *Server) forward(x *exchange, r *http.Request, st *state, who identity.Identity, body []byte) outcome {
	p, ok := s.bal.Pick(nil)
	if !ok {
		return refused(apierror.NoBackend(who.Tier))
	}
	st.id.Strip(r.Header, who.Tenant)
	rq := forward.Request{In: r, Body: body, Upgrade: st.exempt[r.URL.Path], Protected: protected}
	err := s.attempt(x, &rq, p)
	// A body the proxy streams from the client cannot be sent twice.
	if errors.Is(err, forward.ErrUnreachable) && rq.Replayable() && r.Context().Err() == nil {
		if p2, ok := s.bal.Pick(p.Backend); ok {
			s.cfg.Log.V(1).Info("backend unreachable, trying another", "backend", p.Address, "err", err.Error())
			err = s.attempt(x, &rq, p2)
		}
	}
	return s.settle(x, r, err)
}

// protected are the fields the dispatcher sets on a forwarded request
// (identity.Strip): no client's Connection header removes them.
var protected = []string{identity.TenantHeader}

// attempt forwards rq to p's backend once and ends p with what it learnt
// of the backend.
func (s *Server) attempt(x *exchange, rq *forward.Request, p balancer.Picked) error {
	x.backend = p.Backend
	rq.Target = p.URL
	status, err := s.fwd.Forward(&x.sw, *rq)
	x.status = status
	if !errors.Is(err, forward.ErrUnreachable) {
		x.tok.reached = true // it may have used tokens: settled, not refunded
	}
	s.done(x, p, outcomeOf(rq.In.Context(), status, err))
	return err
}

// outcomeOf is what one attempt says of its backend's health.
func outcomeOf(ctx context.Context, status int, err error) balancer.Outcome {
	switch {
	case errors.Is(err, forward.ErrUnreachable):
		return balancer.Unreachable
	case ctx.Err() != nil || errors.Is(err, forward.ErrClientGone):
		return balancer.Unknown // the client left: nothing learnt
	case forward.Dropped(err):
		return balancer.Dropped
	case err != nil || status >= 500:
		return balancer.Failed
	default:
		return balancer.Answered
	}
}

// settle says how the forwarding ended. The client leaving is a 499;
// a backend that failed before answering gets the client a 502; an answer
// cut after its headers (by the backend or the client's connection)
// aborts the handler, so the client sees a broken answer, not a whole one.
func (s *Server) settle(x *exchange, r *http.Request, err error) outcome {
	x.served = err == nil && x.status >= 200 && x.status < 300
	var bodyErr *forward.ClientBodyError
	switch {
	case err == nil && x.sw.code == 0 && x.status == http.StatusSwitchingProtocols:
		return outcome{code: x.status} // written on the switched connection
	case err == nil:
		return served
	case isTooLarge(err) && x.status == 0:
		// An exempt path's streamed body outgrew MaxBodyBytes.
		x.sw.Header().Set("Connection", "close")
		return refused(apierror.BodyTooLarge(s.cfg.MaxBodyBytes))
	case x.status == 0 && errors.As(err, &bodyErr):
		// A streamed body that failed (malformed, or cut short by a
		// client that half-closed, which net/http counts as gone) gets
		// the client a 400, not the empty 200 net/http would send.
		x.sw.Header().Set("Connection", "close")
		return refused(apierror.BadRequest("could not read the request body: " + bodyErr.Err.Error()))
	case r.Context().Err() != nil || errors.Is(err, forward.ErrClientGone):
		// Aborted even when nothing was written: net/http would send a
		// 200 that no backend sent.
		o := clientGone(metrics.StageInflight)
		o.abort = true
		return o
	case errors.Is(err, forward.ErrTimeout):
		return outcome{refusal: apierror.BackendTimeout(x.tier), err: err}
	case errors.Is(err, forward.ErrCut):
		return outcome{code: http.StatusBadGateway, abort: true, err: err}
	default:
		return outcome{refusal: apierror.BackendError(x.tier), err: err}
	}
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

func isTooLarge(err error) bool {
	var tooBig *http.MaxBytesError
	return errors.As(err, &tooBig)
}

// forwardExempt proxies an exempt path without queueing.
func (s *Server) forwardExempt(x *exchange, r *http.Request, st *state, who identity.Identity) outcome {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return refused(apierror.BodyTooLarge(s.cfg.MaxBodyBytes))
	}
	// Not http.MaxBytesReader: the Transport reads the body on a goroutine
	// of its own, which must not touch the ResponseWriter.
	r.Body = &limitedBody{ReadCloser: r.Body, limit: s.cfg.MaxBodyBytes}
	return s.forward(x, r, st, who, nil)
}

// limitedBody fails a body that outgrows limit bytes with an
// *http.MaxBytesError.
type limitedBody struct {
	io.ReadCloser
	limit, read int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.read > b.limit {
		return 0, &http.MaxBytesError{Limit: b.limit}
	}
	// One byte more than allowed tells a body at the limit from one past it.
	if room := b.limit - b.read + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if b.read > b.limit {
		return n - int(b.read-b.limit), &http.MaxBytesError{Limit: b.limit}
	}
	return n, err
}
