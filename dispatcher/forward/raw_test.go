package forward

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawBackend is a backend written on a bare socket, so that it can
// misbehave in ways net/http's server never would. Every connection it
// accepts is served by script; over https it is wrapped in tls.Server, so
// each Write is a TLS record of its own.
type rawBackend struct {
	URL    string
	RootCA *x509.CertPool // trusts the https certificate
	l      net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed chan struct{}
}

// script serves one backend connection; br reads what the dispatcher sent.
type script func(c net.Conn, br *bufio.Reader)

func newRawBackend(t testing.TB, https bool, s script) *rawBackend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{l: l, closed: make(chan struct{}), URL: "http://" + l.Addr().String()}
	if https {
		// httptest's certificate is for 127.0.0.1; only its TLS config is used.
		ts := httptest.NewUnstartedServer(http.NotFoundHandler())
		ts.StartTLS()
		cfg := ts.TLS.Clone()
		b.RootCA = x509.NewCertPool()
		b.RootCA.AddCert(ts.Certificate())
		ts.Close()
		cfg.NextProtos = []string{"http/1.1"}
		b.l = tls.NewListener(l, cfg)
		b.URL = "https://" + l.Addr().String()
	}
	b.wg.Add(1)
	go b.accept(s)
	t.Cleanup(b.Close)
	return b
}

func (b *rawBackend) accept(s script) {
	defer b.wg.Done()
	for {
		c, err := b.l.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer c.Close()
			s(c, bufio.NewReader(c))
		}()
	}
}

// Close stops accepting, closes every connection and waits for the
// scripts to return.
func (b *rawBackend) Close() {
	select {
	case <-b.closed:
		return
	default:
		close(b.closed)
	}
	_ = b.l.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// tlsOptions trusts b's certificate (when it has one).
func (b *rawBackend) options(o Options) Options {
	if b.RootCA != nil {
		o.TLS = &tls.Config{RootCAs: b.RootCA, MinVersion: tls.VersionTLS12}
	}
	return o
}

// readRequest reads one request and its body; nil when the connection
// ended.
func readRequest(br *bufio.Reader) *http.Request {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil
	}
	_, _ = io.Copy(io.Discard, req.Body)
	return req
}

// ownAnswer is the answer of a well-behaved backend to req: its path
// (and tenant, when it names one), so that a client can tell its own
// answer from anyone else's.
func ownAnswer(req *http.Request) string {
	body := "own:" + req.URL.Path
	if tenant := req.Header.Get("X-Tiergate-Tenant"); tenant != "" {
		body += "@" + tenant
	}
	if req.Method == http.MethodHead {
		return "HTTP/1.1 200 OK\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n"
	}
	return "HTTP/1.1 200 OK\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body
}

// serveOwn answers every further request on the connection correctly.
func serveOwn(c net.Conn, br *bufio.Reader) {
	for {
		req := readRequest(br)
		if req == nil {
			return
		}
		if _, err := io.WriteString(c, ownAnswer(req)); err != nil {
			return
		}
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// awaitClose waits, at most d, for the dispatcher to close c (a read ends
// in EOF or an error); it reports whether it did.
func awaitClose(c net.Conn, br *bufio.Reader, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	_, err := br.Peek(1)
	var ne net.Error
	return err != nil && (!errors.As(err, &ne) || !ne.Timeout())
}

// rawClient sends raw bytes to addr and returns the connection, for
// clients that misbehave.
func rawClient(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}
