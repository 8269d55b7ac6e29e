package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"
)

// Sentinel errors of Forward, to match with errors.Is.
var (
	// ErrUnreachable: no connection to the backend could be made (the
	// dial or the TLS handshake failed), so nothing was sent; the request
	// may be tried on another backend.
	ErrUnreachable = errors.New("forward: backend unreachable")
	// ErrNoAnswer: the backend failed before sending its headers; nothing
	// was written to the client but the 1xx answers passed on.
	ErrNoAnswer = errors.New("forward: backend failed before answering")
	// ErrTimeout: the backend sent no response head within
	// Options.ResponseHeaderTimeout; nothing was written to the client.
	ErrTimeout = errors.New("forward: backend sent no answer in time")
	// ErrCut: the backend's answer broke after its headers went to the
	// client, which therefore holds an incomplete answer.
	ErrCut = errors.New("forward: answer cut")
	// ErrClientGone: the client failed: its body could not be read as it
	// streamed to the backend (then the error is also ErrClientBody), or
	// the answer could not be written to it.
	ErrClientGone = errors.New("forward: client gone")
	// ErrClientBody: the client's streamed body could not be read (the
	// cause says why: a read error, or an *http.MaxBytesError). It comes
	// with ErrClientGone.
	ErrClientBody = errors.New("forward: reading the client's body")
)

// Options tune a Forwarder's http.Transport. New takes them as they are:
// a zero value is the Transport's (no limit, or its own default), and
// DefaultOptions are the dispatcher's defaults.
type Options struct {
	// DialTimeout bounds making a connection and its TLS handshake.
	DialTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept per
	// backend; it should be at least the slots, so that a full pool of
	// requests finds its connections again.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes a connection idle for longer.
	IdleConnTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a response head once the
	// request is written; past it the answer is ErrTimeout. It must fit
	// the longest prefill.
	ResponseHeaderTimeout time.Duration
	// MaxResponseHeaderBytes bounds a response head (each 1xx's, and the
	// final one's); a larger one is ErrNoAnswer.
	MaxResponseHeaderBytes int64
	// TLS is the client configuration for https backends; nil verifies
	// against the system roots. ServerName defaults to the backend's host.
	TLS *tls.Config
	// Dial makes connections (tests); nil is a net.Dialer with TCP
	// keep-alives.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Defaults of Options (DefaultOptions).
const (
	DefaultDialTimeout            = 5 * time.Second
	DefaultMaxIdleConnsPerHost    = 1024
	DefaultIdleConnTimeout        = 90 * time.Second
	DefaultResponseHeaderTimeout  = 5 * time.Minute // fits long prefills
	DefaultMaxResponseHeaderBytes = 1 << 20
)

// DefaultOptions are the defaults above; dispatcher.Config applies them.
func DefaultOptions() Options {
	return Options{
		DialTimeout:            DefaultDialTimeout,
		MaxIdleConnsPerHost:    DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:        DefaultIdleConnTimeout,
		ResponseHeaderTimeout:  DefaultResponseHeaderTimeout,
		MaxResponseHeaderBytes: DefaultMaxResponseHeaderBytes,
	}
}

// Forwarder forwards requests to backends. Its zero value is not usable;
// build one with New.
type Forwarder struct {
	opt Options
	tr  *http.Transport
}

// New builds a Forwarder over an http.Transport tuned by opt.
func New(opt Options) *Forwarder {
	if opt.Dial == nil {
		opt.Dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	f := &Forwarder{opt: opt}
	f.tr = newTransport(f)
	return f
}

// CloseIdle closes every idle connection.
func (f *Forwarder) CloseIdle() { f.tr.CloseIdleConnections() }

// Request is one request to forward.
type Request struct {
	// In is the client's request. Its headers are sent as they are, less
	// the hop-by-hop ones; its URL's path and query are the target's.
	In *http.Request
	// Target is the backend: scheme ("http" or "https") and host:port.
	Target *url.URL
	// Body is the request body read in full, sent with its length; nil
	// streams In.Body instead (as In.ContentLength says, or chunked).
	Body []byte
	// Upgrade allows a protocol switch the client asked for.
	Upgrade bool
	// Protected are fields the dispatcher set in In.Header (canonical
	// form): they are sent even when the client's Connection header
	// names them, so a client cannot remove them.
	Protected []string
}

// Replayable says whether the request can be sent twice: its body is in
// memory, or it has none.
func (rq *Request) Replayable() bool {
	if rq.Body != nil {
		return true
	}
	return rq.In.Body == nil || rq.In.Body == http.NoBody
}

// Forward sends rq to its target and copies the answer to w. It returns
// the backend's final status (0 when it gave none) and nil, or an error
// wrapping one of the sentinels. When the client's context ends first the
// error is the context's, wrapped, and nothing more is written.
func (f *Forwarder) Forward(w http.ResponseWriter, rq Request) (int, error) {
	ctx := rq.In.Context()
	ex := newExchange(w, &rq)
	resp, err := f.tr.RoundTrip(ex.out)
	ex.roundTripDone()
	if err != nil && ex.resendable() {
		ex = newExchange(w, &rq)
		resp, err = f.tr.RoundTrip(ex.out)
		ex.roundTripDone()
	}
	if err != nil {
		ex.releaseBody(w)
		if berr := ex.bodyFailure(); berr != nil {
			return 0, fmt.Errorf("%w: %w", ErrClientGone, berr)
		}
		return 0, f.failure(ctx, err)
	}
	status, err := ex.answer(resp)
	// Closed before the body is released: closing the Transport's
	// connection is what ends a write the backend no longer reads.
	_ = resp.Body.Close()
	ex.releaseBody(w)
	if err != nil {
		return status, cutFailure(ctx, err)
	}
	return status, nil
}

// failure is the error of a request that got no answer: the context's
// when the client left, else what the Transport's error says.
func (f *Forwarder) failure(ctx context.Context, err error) error {
	var ne net.Error
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("forward: %w (%w)", ctx.Err(), err)
	case errors.Is(err, ErrClientBody):
		return fmt.Errorf("%w: %w", ErrClientGone, err)
	case errors.Is(err, ErrUnreachable), errors.Is(err, ErrNoAnswer):
		return err // already says what failed
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	default:
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
}

// Dropped reports whether a failed exchange's backend connection ended
// before an answer: closed (EOF) or reset by the backend's side, as when
// its process or host is gone. A malformed answer or a timeout is not a
// dropped connection: the backend is alive but wrong or slow.
func Dropped(err error) bool {
	if !errors.Is(err, ErrNoAnswer) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EPIPE)
}

// cutFailure is the error of an answer that broke after its head went to
// the client.
func cutFailure(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("forward: %w (%w)", ctx.Err(), err)
	case errors.Is(err, ErrClientGone), errors.Is(err, ErrNoAnswer):
		return err
	default:
		return fmt.Errorf("%w: %w", ErrCut, err)
	}
}
