package forward

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
)

// newTransport is the Transport of f: HTTP/1.1 only (a backend is never
// asked for h2), no proxy from the environment, no transparent gzip (the
// client's Accept-Encoding goes through untouched, and so does the
// answer), and dials that tell a connection never made (ErrUnreachable)
// from every later failure.
func newTransport(f *Forwarder) *http.Transport {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            f.dial,
		DialTLSContext:         f.dialTLS,
		MaxIdleConnsPerHost:    f.opt.MaxIdleConnsPerHost,
		IdleConnTimeout:        f.opt.IdleConnTimeout,
		ResponseHeaderTimeout:  f.opt.ResponseHeaderTimeout,
		MaxResponseHeaderBytes: f.opt.MaxResponseHeaderBytes,
		DisableCompression:     true,
		Protocols:              &protocols,
	}
}

// withDialTimeout bounds ctx by DialTimeout, when there is one.
func (f *Forwarder) withDialTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.opt.DialTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, f.opt.DialTimeout)
}

// dial connects to addr; its failure is ErrUnreachable.
func (f *Forwarder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := f.withDialTimeout(ctx)
	defer cancel()
	c, err := f.opt.Dial(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return c, nil
}

// dialTLS connects to addr and completes the TLS handshake, both within
// DialTimeout; a failure of either is ErrUnreachable.
func (f *Forwarder) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := f.withDialTimeout(ctx)
	defer cancel()
	c, err := f.opt.Dial(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	tc := tls.Client(c, f.tlsConfig(addr))
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%w: TLS handshake with %s: %w", ErrUnreachable, addr, err)
	}
	return tc, nil
}

// tlsConfig is Options.TLS for addr: its ServerName the backend's host
// unless set, and HTTP/1.1 the only protocol offered.
func (f *Forwarder) tlsConfig(addr string) *tls.Config {
	cfg := &tls.Config{}
	if f.opt.TLS != nil {
		cfg = f.opt.TLS.Clone()
	}
	if cfg.ServerName == "" {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = h
		} else {
			cfg.ServerName = addr
		}
	}
	cfg.NextProtos = []string{"http/1.1"}
	return cfg
}
