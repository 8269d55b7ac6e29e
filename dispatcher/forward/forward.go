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
	"sync"
	"time"
)

// Sentinel errors of Forward, to match with errors.Is.
var (
	// ErrUnreachable: no connection to the backend could be made, so
	// nothing was sent; the request may be tried on another backend.
	ErrUnreachable = errors.New("forward: backend unreachable")
	// ErrNoAnswer: the backend failed before sending its headers; nothing
	// was written to the client.
	ErrNoAnswer = errors.New("forward: backend failed before answering")
	// ErrCut: the backend's answer broke after its headers went to the
	// client, which therefore holds an incomplete answer.
	ErrCut = errors.New("forward: answer cut")
	// ErrClientGone: the client failed: its body could not be read as it
	// streamed to the backend (the cause says why: a read error, or an
	// *http.MaxBytesError), or the answer could not be written to it.
	ErrClientGone = errors.New("forward: client gone")
)

// Options tune a Forwarder. dispatcher.Config fills them, from
// DefaultOptions; the forwarder ignores the response-head bounds for now.
type Options struct {
	// DialTimeout bounds making a connection (and its TLS handshake).
	DialTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept per
	// backend; at least the slots, so a busy pool reconnects rarely.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes a connection idle for longer.
	IdleConnTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a backend's response head
	// after the request was sent (ErrTimeout). It must fit long prefills.
	ResponseHeaderTimeout time.Duration
	// MaxResponseHeaderBytes bounds a backend's response head; a larger
	// one is a backend failure (502).
	MaxResponseHeaderBytes int64
	// TLS is the client configuration for https backends; nil verifies
	// against the system roots. ServerName defaults to the backend's host.
	TLS *tls.Config
	// Dial makes connections (tests); nil is a net.Dialer with TCP
	// keep-alives.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Defaults of Options.
const (
	DefaultDialTimeout            = 5 * time.Second
	DefaultMaxIdleConnsPerHost    = 1024
	DefaultIdleConnTimeout        = 90 * time.Second
	DefaultResponseHeaderTimeout  = 5 * time.Minute // fits long prefills
	DefaultMaxResponseHeaderBytes = 1 << 20
)

// DefaultOptions are the defaults above, for dispatcher.Config to apply.
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

	mu        sync.Mutex
	idle      map[poolKey][]*conn
	lastSweep time.Time
}

type poolKey struct{ scheme, host string }

// New builds a Forwarder.
func New(opt Options) *Forwarder {
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = DefaultDialTimeout
	}
	if opt.MaxIdleConnsPerHost <= 0 {
		opt.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if opt.IdleConnTimeout <= 0 {
		opt.IdleConnTimeout = DefaultIdleConnTimeout
	}
	if opt.Dial == nil {
		opt.Dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	return &Forwarder{opt: opt, idle: make(map[poolKey][]*conn)}
}

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
	key := poolKey{rq.Target.Scheme, rq.Target.Host}
	c, err := f.get(ctx, key)
	if err != nil {
		return 0, err
	}
	resp, err := c.roundTrip(ctx, w, &rq)
	if err != nil && c.reused && c.unsent && rq.Replayable() && ctx.Err() == nil && !errors.Is(err, ErrClientGone) {
		// The backend closed a pooled connection as the request went
		// out: it has not seen it, so it goes once more on a new one.
		c.close()
		if c, err = f.dial(ctx, key); err != nil {
			return 0, err
		}
		resp, err = c.roundTrip(ctx, w, &rq)
	}
	if err != nil {
		c.close()
		return 0, failure(ctx, ErrNoAnswer, err)
	}
	status, err := f.answer(w, c, &rq, resp)
	if err != nil {
		// Closed first: closing the body of a broken answer would read on.
		c.close()
		_ = resp.Body.Close()
		return status, failure(ctx, ErrCut, err)
	}
	_ = resp.Body.Close() // read to its end: nothing left to read
	f.put(c, resp)
	return status, nil
}

// failure is the error of a failed exchange: the context's when the
// client left (the cause of the failure), else kind.
func failure(ctx context.Context, kind, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("forward: %w (%w)", ctx.Err(), err)
	}
	if errors.Is(err, ErrClientGone) || errors.Is(err, ErrNoAnswer) {
		return err // already says what failed
	}
	return fmt.Errorf("%w: %w", kind, err)
}

// roundTrip writes rq on c and reads the head of the final answer (or of a
// 101), passing 1xx answers on to w as they come. It arms c to be
// interrupted if ctx ends.
func (c *conn) roundTrip(ctx context.Context, w http.ResponseWriter, rq *Request) (*http.Response, error) {
	c.watch(ctx)
	c.unsent = true
	err := c.writeRequest(rq)
	if errors.Is(err, errClientBody) {
		// The client failed: the backend holds half a request, and the
		// connection is done for.
		c.broken = true
		return nil, fmt.Errorf("%w: %w", ErrClientGone, err)
	}
	if err != nil {
		// A write that failed may have raced an answer the backend sent
		// before it closed (a 413, say): read it if it is there already.
		c.broken = true
		_ = c.SetReadDeadline(time.Now().Add(salvageWait))
		if resp, rerr := c.readHead(w, rq); rerr == nil {
			return resp, nil
		}
		return nil, err
	}
	c.unsent = false
	return c.readHead(w, rq)
}

// salvageWait bounds the look for an answer after a failed write.
const salvageWait = 250 * time.Millisecond

// readHead reads the answer's head. 1xx answers but 101 are informational:
// their headers go to the client at once, and the next head is read.
func (c *conn) readHead(w http.ResponseWriter, rq *Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(c.br, rq.In)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
		// The headers set so far belong to the final answer: they are
		// sent with the 1xx too, and kept for it.
		h := w.Header()
		kept := h.Clone()
		copyHeader(h, resp.Header)
		w.WriteHeader(resp.StatusCode)
		clear(h)
		copyHeader(h, kept)
	}
}
