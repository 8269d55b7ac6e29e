package forward

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// maxInformational caps the 1xx answers of one request: a backend that
// sends more is broken (ErrNoAnswer), and is not let flood the client.
const maxInformational = 5

// errTooManyInformational: the backend sent more than maxInformational
// 1xx answers.
var errTooManyInformational = fmt.Errorf("more than %d informational (1xx) answers", maxInformational)

// exchange is one Forward: the request as it goes out, and what the
// Transport's goroutines share with the caller's.
type exchange struct {
	w    http.ResponseWriter
	rq   *Request
	out  *http.Request
	body *clientBody // nil unless the body streams from the client
	mem  memBody
	url  url.URL

	// mu orders the 1xx answers, passed on from the Transport's read
	// loop, before the end of RoundTrip: after it, w is the caller's.
	mu       sync.Mutex
	done     bool
	n1xx     int
	reused   bool  // the last connection taken was an idle one
	writeErr error // writing the request failed
	trace    httptrace.ClientTrace
	scratch  http.Header
}

func newExchange(w http.ResponseWriter, rq *Request) *exchange {
	ex := &exchange{w: w, rq: rq}
	in := rq.In
	ex.trace.Got1xxResponse = ex.got1xx
	ex.trace.GotConn = ex.gotConn
	ex.trace.WroteRequest = ex.wroteRequest
	out := in.WithContext(httptrace.WithClientTrace(in.Context(), &ex.trace))
	ex.url = url.URL{
		Scheme: rq.Target.Scheme, Host: rq.Target.Host,
		Path: in.URL.Path, RawPath: in.URL.RawPath, RawQuery: in.URL.RawQuery, ForceQuery: in.URL.ForceQuery,
	}
	out.URL, out.Host, out.RequestURI = &ex.url, rq.Target.Host, ""
	out.Close, out.TransferEncoding = false, nil
	out.Header = outHeader(rq)
	ex.setBody(out)
	ex.out = out
	return ex
}

// setBody gives out its body: the one in memory (replayable, so the
// Transport may resend it on a connection that broke before it was
// written), none, or the client's, streamed.
func (ex *exchange) setBody(out *http.Request) {
	rq, in := ex.rq, ex.rq.In
	switch {
	case len(rq.Body) > 0:
		ex.mem.Reset(rq.Body)
		out.Body, out.ContentLength = &ex.mem, int64(len(rq.Body))
		out.GetBody = ex.getBody
	case rq.Body != nil || in.Body == nil || in.Body == http.NoBody:
		out.Body, out.ContentLength, out.GetBody = http.NoBody, 0, nil
	default:
		ex.body = &clientBody{r: in.Body, closed: make(chan struct{})}
		out.Body, out.GetBody = ex.body, nil
		if in.ContentLength <= 0 {
			out.ContentLength = -1 // chunked, with the client's trailers
		}
	}
}

func (ex *exchange) getBody() (io.ReadCloser, error) {
	return &memBody{Reader: *bytes.NewReader(ex.rq.Body)}, nil
}

// outHeader is the client's header less the fields that stay on the
// client's connection (or that the Transport writes itself), plus what
// rq allows: Te: trailers, and the upgrade the client asked for.
func outHeader(rq *Request) http.Header {
	in := rq.In.Header
	h := make(http.Header, len(in)+1)
	conn := in["Connection"]
	for k, vv := range in {
		if notForwarded[k] || (!endToEnd(k, conn) && !isProtected(rq.Protected, k)) {
			continue
		}
		h[k] = vv
	}
	if HasToken(in["Te"], "trailers") {
		h["Te"] = trailersOnly
	}
	if up := in["Upgrade"]; rq.Upgrade && len(up) > 0 && HasToken(conn, "upgrade") {
		h["Connection"] = upgradeOnly
		h["Upgrade"] = up[:1]
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = noUserAgent // the Transport would add its own
	}
	return h
}

var (
	trailersOnly = []string{"trailers"}
	upgradeOnly  = []string{"Upgrade"}
	noUserAgent  = []string{""}
)

func isProtected(protected []string, k string) bool {
	for _, p := range protected {
		if p == k && !hopByHop[k] {
			return true
		}
	}
	return false
}

// got1xx passes a 1xx answer on to an HTTP/1.1 client (RFC 9110 section
// 15.2: never to an HTTP/1.0 one), at most maxInformational of them. The
// headers set so far belong to the final answer: they go with the 1xx
// too, and are kept for it.
func (ex *exchange) got1xx(code int, header textproto.MIMEHeader) error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.done {
		return nil
	}
	if ex.n1xx++; ex.n1xx > maxInformational {
		return errTooManyInformational
	}
	if !ex.rq.In.ProtoAtLeast(1, 1) {
		return nil
	}
	h := ex.w.Header()
	ex.scratch = h.Clone()
	copyHeader(h, http.Header(header))
	ex.w.WriteHeader(code)
	clear(h)
	copyHeader(h, ex.scratch)
	return nil
}

func (ex *exchange) gotConn(info httptrace.GotConnInfo) {
	ex.mu.Lock()
	ex.reused = info.Reused
	ex.mu.Unlock()
}

func (ex *exchange) wroteRequest(info httptrace.WroteRequestInfo) {
	ex.mu.Lock()
	ex.writeErr = info.Err
	ex.mu.Unlock()
}

// resendable says whether a failed RoundTrip may go once more: the
// request could not be written whole to a connection that had been idle
// (the backend closed it as it was reused), so the backend never
// processed it; its body is in memory, and no 1xx went to the client.
// The Transport itself resends only what it wrote nothing of, or
// idempotent requests.
func (ex *exchange) resendable() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.reused && ex.writeErr != nil && ex.n1xx == 0 && ex.rq.Replayable() &&
		ex.body == nil && ex.rq.In.Context().Err() == nil
}

// roundTripDone ends the passing on of 1xx answers.
func (ex *exchange) roundTripDone() {
	ex.mu.Lock()
	ex.done = true
	ex.mu.Unlock()
}

// releaseBody returns once the Transport is done with the client's body,
// so nothing reads it after Forward returns. A body the backend answered
// before reading whole would keep the Transport reading from the client:
// the client's read deadline is moved to now to end that read (net/http
// closes such a connection after the answer anyway).
func (ex *exchange) releaseBody(w http.ResponseWriter) {
	if ex.body == nil {
		return
	}
	select {
	case <-ex.body.closed:
		return
	default:
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	t := time.NewTimer(releaseWait)
	defer t.Stop()
	select {
	case <-ex.body.closed:
	case <-t.C: // never seen; a bound all the same
	}
}

// releaseWait bounds the wait for the Transport to let go of a body.
const releaseWait = 10 * time.Second

// memBody is a request body read from memory: one allocation where
// io.NopCloser(bytes.NewReader(b)) takes two.
type memBody struct{ bytes.Reader }

func (*memBody) Close() error { return nil }

// clientBody is the client's body as the Transport reads it: its read
// errors are ErrClientBody (the client's fault, not the backend's), and
// closed tells when the Transport is done with it.
type clientBody struct {
	r      io.ReadCloser
	once   sync.Once
	closed chan struct{}
	// failed is the first read error: the client's body failing may
	// also end the request's context, and that must not hide it.
	failed atomic.Pointer[ClientBodyError]
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		e := &ClientBodyError{Err: err}
		b.failed.CompareAndSwap(nil, e)
		return n, e
	}
	return n, err
}

// bodyFailure is the error of the client's body, or nil.
func (ex *exchange) bodyFailure() error {
	if ex.body == nil {
		return nil
	}
	if e := ex.body.failed.Load(); e != nil {
		return e
	}
	return nil
}

// ClientBodyError is the failure of a client's streamed body; it is
// ErrClientBody, and Err is the read's error.
type ClientBodyError struct{ Err error }

func (e *ClientBodyError) Error() string { return ErrClientBody.Error() + ": " + e.Err.Error() }
func (e *ClientBodyError) Unwrap() error { return e.Err }

// Is makes every ClientBodyError match ErrClientBody in errors.Is.
func (e *ClientBodyError) Is(target error) bool { return target == ErrClientBody }

func (b *clientBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
