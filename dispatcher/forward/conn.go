package forward

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"
)

// conn is one connection to a backend, used by one request at a time.
type conn struct {
	net.Conn
	key    poolKey
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time
	reused bool // it came from the idle pool
	unsent bool // the request being written has not reached the backend whole
	broken bool // a write failed: never reused
	// stop disarms the interrupt of the request in progress; it reports
	// false when the interrupt already ran (the deadline is in the past).
	stop func() bool
	// interrupt fails the pending reads and writes; made once per
	// connection, as is the peek, so a request allocates neither.
	interrupt func()
	peek      *peeker // nil where the socket cannot be peeked at
	// scratch formats lengths without allocating.
	scratch [20]byte
}

// longAgo is a deadline in the past: it fails every pending read and write.
var longAgo = time.Unix(1, 0)

// watch interrupts c when ctx ends.
func (c *conn) watch(ctx context.Context) {
	if c.stop != nil {
		c.stop()
	}
	c.stop = context.AfterFunc(ctx, c.interrupt)
}

// release disarms the interrupt; false when it had already fired.
func (c *conn) release() bool {
	if c.stop == nil {
		return true
	}
	ok := c.stop()
	c.stop = nil
	return ok
}

func (c *conn) close() {
	c.release()
	_ = c.Close()
}

// get takes an idle connection to key that is still open, or makes one.
func (f *Forwarder) get(ctx context.Context, key poolKey) (*conn, error) {
	for {
		c := f.takeIdle(key)
		if c == nil {
			return f.dial(ctx, key)
		}
		if c.alive() {
			return c, nil
		}
		_ = c.Close()
	}
}

// takeIdle pops the most recently used idle connection of key, closing
// those idle for too long on the way.
func (f *Forwarder) takeIdle(key poolKey) *conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	cs := f.idle[key]
	for len(cs) > 0 {
		c := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		cs = cs[:len(cs)-1]
		if time.Since(c.idleAt) < f.opt.IdleConnTimeout {
			f.idle[key] = cs
			c.reused = true
			return c
		}
		_ = c.Close()
	}
	f.idle[key] = cs
	return nil
}

// alive says whether an idle connection is still open: a backend that
// closed it (or wrote to it out of turn) makes it readable, and an open
// idle one is not.
func (c *conn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.peek == nil {
		return true // nothing to ask; a failed write is retried
	}
	return c.peek.readable() == nil
}

// dial makes a new connection to key, with TLS for https.
func (f *Forwarder) dial(ctx context.Context, key poolKey) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, f.opt.DialTimeout)
	defer cancel()
	nc, err := f.opt.Dial(dctx, "tcp", key.host)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	if key.scheme == "https" {
		tc := tls.Client(nc, f.tlsConfig(key.host))
		if err := tc.HandshakeContext(dctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("%w: TLS handshake with %s: %w", ErrUnreachable, key.host, err)
		}
		nc = tc
	}
	return newConn(nc, key), nil
}

func newConn(nc net.Conn, key poolKey) *conn {
	c := &conn{Conn: nc, key: key, br: bufio.NewReaderSize(nc, 4<<10), bw: bufio.NewWriterSize(nc, 4<<10)}
	c.interrupt = func() { _ = c.SetDeadline(longAgo) }
	raw := nc
	if tc, ok := raw.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	if sc, ok := raw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.peek = newPeeker(rc)
		}
	}
	return c
}

func (f *Forwarder) tlsConfig(host string) *tls.Config {
	cfg := &tls.Config{}
	if f.opt.TLS != nil {
		cfg = f.opt.TLS.Clone()
	}
	if cfg.ServerName == "" {
		if h, _, err := net.SplitHostPort(host); err == nil {
			cfg.ServerName = h
		} else {
			cfg.ServerName = host
		}
	}
	// HTTP/1.1 only: this forwarder speaks nothing else.
	cfg.NextProtos = []string{"http/1.1"}
	return cfg
}

// put returns c to its pool when the exchange left it clean: the answer
// read to its end, nothing more buffered, and neither side closing.
func (f *Forwarder) put(c *conn, resp *http.Response) {
	if !c.release() || c.broken || resp.Close || resp.StatusCode == http.StatusSwitchingProtocols || c.br.Buffered() > 0 {
		_ = c.Close()
		return
	}
	now := time.Now()
	c.idleAt = now
	f.mu.Lock()
	cs := f.idle[c.key]
	if len(cs) >= f.opt.MaxIdleConnsPerHost {
		f.mu.Unlock()
		_ = c.Close()
		return
	}
	f.idle[c.key] = append(cs, c)
	var stale []*conn
	if now.Sub(f.lastSweep) > f.opt.IdleConnTimeout/2 {
		f.lastSweep = now
		stale = f.sweepLocked(now)
	}
	f.mu.Unlock()
	for _, s := range stale {
		_ = s.Close()
	}
}

// sweepLocked takes out the connections idle for longer than IdleTimeout,
// so a backend that left does not keep its idle connections open.
func (f *Forwarder) sweepLocked(now time.Time) []*conn {
	var stale []*conn
	for k, cs := range f.idle {
		kept := cs[:0]
		for _, c := range cs {
			if now.Sub(c.idleAt) >= f.opt.IdleConnTimeout {
				stale = append(stale, c)
			} else {
				kept = append(kept, c)
			}
		}
		clear(cs[len(kept):])
		if len(kept) == 0 {
			delete(f.idle, k)
		} else {
			f.idle[k] = kept
		}
	}
	return stale
}

// CloseIdle closes every idle connection.
func (f *Forwarder) CloseIdle() {
	f.mu.Lock()
	idle := f.idle
	f.idle = make(map[poolKey][]*conn)
	f.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			_ = c.Close()
		}
	}
}

// Idle is the number of idle connections to scheme://host.
func (f *Forwarder) Idle(scheme, host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.idle[poolKey{scheme, host}])
}
