package forward

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/internal/testutil"
)

// result is what one Forward returned, as the front handler saw it.
type result struct {
	status int
	err    error
}

// front is a server in front of target that forwards every request with
// f, reading the body first when buffered, and reports each Forward's
// result on results.
type front struct {
	*httptest.Server
	results chan result
}

type frontOptions struct {
	buffered bool // read the body first and pass it as Request.Body
	upgrade  bool
}

func newFront(t *testing.T, f *Forwarder, target string, o frontOptions) *front {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	fr := &front{results: make(chan result, 16)}
	fr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rq := Request{In: r, Target: u, Upgrade: o.upgrade}
		if o.buffered {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("front: reading the body: %v", err)
				return
			}
			rq.Body = b
		}
		status, err := f.Forward(w, rq)
		fr.results <- result{status, err}
		if err != nil && status != 0 {
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(fr.Close)
	t.Cleanup(f.CloseIdle)
	return fr
}

func (fr *front) result(t *testing.T) result {
	t.Helper()
	select {
	case r := <-fr.results:
		return r
	case <-t.Context().Done():
		t.Fatal("no result")
		return result{}
	}
}

// counting is a backend that counts the connections made to it.
func counting(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	be := httptest.NewUnstartedServer(h)
	be.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	be.Start()
	t.Cleanup(be.Close)
	return be, &conns
}

// reply is an answer the client read whole.
type reply struct {
	status          int
	header, trailer http.Header
}

func get(t *testing.T, c *http.Client, req *http.Request) (reply, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, resp.Trailer}, string(b)
}

func newRequest(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestHeaders(t *testing.T) {
	var seen http.Header
	var host string
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
		seen, host = r.Header.Clone(), r.Host
		h := w.Header()
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("X-End", "kept")
		h["Content-Type"] = nil // none: the front must not sniff one either
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "<html>not sniffed</html>")
	})
	fr := newFront(t, New(Options{}), be.URL, frontOptions{buffered: true})
	req := newRequest(t, http.MethodPost, fr.URL+"/v1/completions?stream=false", "{}")
	for k, v := range map[string]string{
		"Connection": "X-Named", "X-Named": "dropped", "Keep-Alive": "timeout=1",
		"Proxy-Authorization": "Basic eA==", "Te": "trailers, deflate", "Upgrade": "websocket",
		"Forwarded": "for=10.0.0.1", "X-Forwarded-For": "10.0.0.1", "X-Forwarded-Host": "evil",
		"X-Forwarded-Proto": "https", "X-Client": "kept", "User-Agent": "client/1",
	} {
		req.Header.Set(k, v)
	}
	rep, body := get(t, fr.Client(), req)
	if r := fr.result(t); r.err != nil || r.status != http.StatusCreated {
		t.Fatalf("Forward = %d, %v; want 201, nil", r.status, r.err)
	}
	wantSeen := http.Header{
		"Accept-Encoding": {"gzip"}, // the test client's own
		"Content-Length":  {"2"},
		"Te":              {"trailers"},
		"User-Agent":      {"client/1"},
		"X-Client":        {"kept"},
	}
	if diff := cmp.Diff(wantSeen, seen); diff != "" {
		t.Errorf("the backend saw (-want +got):\n%s", diff)
	}
	if want := strings.TrimPrefix(be.URL, "http://"); host != want {
		t.Errorf("the backend saw Host %q, want %q", host, want)
	}
	got := rep.header.Clone()
	got.Del("Date")
	wantResp := http.Header{"X-End": {"kept"}, "Content-Length": {"24"}}
	if diff := cmp.Diff(wantResp, got); diff != "" {
		t.Errorf("the client saw (-want +got):\n%s", diff)
	}
	if body != "<html>not sniffed</html>" {
		t.Errorf("body %q", body)
	}
}

func TestTargetURL(t *testing.T) {
	var uris []string
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) { uris = append(uris, r.RequestURI) })
	fr := newFront(t, New(Options{}), be.URL, frontOptions{})
	for _, p := range []string{"/", "/v1/models", "/a%2Fb?x=1&y=%20", "/q?"} {
		get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL+p, ""))
		fr.result(t)
	}
	if diff := cmp.Diff([]string{"/", "/v1/models", "/a%2Fb?x=1&y=%20", "/q?"}, uris); diff != "" {
		t.Errorf("request URIs (-want +got):\n%s", diff)
	}
}

func TestReusesConnections(t *testing.T) {
	be, conns := counting(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	f := New(Options{})
	fr := newFront(t, f, be.URL, frontOptions{buffered: true})
	for range 5 {
		get(t, fr.Client(), newRequest(t, http.MethodPost, fr.URL, "x"))
		if r := fr.result(t); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("%d connections to the backend for 5 requests in a row, want 1", got)
	}
}

// A pooled connection the backend closed is noticed before it is used.
func TestClosedIdleConnectionIsNotUsed(t *testing.T) {
	be, conns := counting(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	fr := newFront(t, New(Options{}), be.URL, frontOptions{buffered: true})
	for i := range 3 {
		rep, body := get(t, fr.Client(), newRequest(t, http.MethodPost, fr.URL, "x"))
		if r := fr.result(t); r.err != nil || rep.status != http.StatusOK || body != "ok" {
			t.Fatalf("request %d: %d %q, Forward error %v", i, rep.status, body, r.err)
		}
		be.CloseClientConnections()
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("%d connections, want 3 (one per request)", got)
	}
}

func TestIdleLimits(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		be, conns := counting(t, func(w http.ResponseWriter, r *http.Request) {})
		fr := newFront(t, New(Options{IdleConnTimeout: 1}), be.URL, frontOptions{})
		for range 2 {
			get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL, ""))
			fr.result(t)
		}
		if got := conns.Load(); got != 2 {
			t.Errorf("%d connections, want 2: an idle one outlived IdleConnTimeout", got)
		}
	})
	t.Run("per host", func(t *testing.T) {
		release := make(chan struct{})
		closed := make(chan struct{}, 3)
		var arrived sync.WaitGroup
		arrived.Add(3)
		be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { arrived.Done(); <-release }))
		be.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				closed <- struct{}{}
			}
		}
		be.Start()
		t.Cleanup(be.Close)
		fr := newFront(t, New(Options{MaxIdleConnsPerHost: 1}), be.URL, frontOptions{})
		var done sync.WaitGroup
		for range 3 {
			done.Go(func() { get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL, "")) })
		}
		arrived.Wait()
		close(release)
		done.Wait()
		// Two of the three connections are closed as they go idle; the
		// third is kept.
		for range 2 {
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("fewer than 2 connections closed after 3 concurrent requests, with MaxIdleConnsPerHost 1")
			}
		}
		select {
		case <-closed:
			t.Error("all 3 connections closed; want 1 kept idle")
		default:
		}
	})
}

// Every event of a stream reaches the client before the backend writes
// the next: the backend waits for the client to have it.
func TestStreamsEventByEvent(t *testing.T) {
	got := make(chan struct{})
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			_, _ = io.WriteString(w, "data: "+string(rune('a'+i))+"\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-got:
			case <-r.Context().Done():
				return
			}
		}
	})
	fr := newFront(t, New(Options{}), be.URL, frontOptions{buffered: true})
	resp, err := fr.Client().Do(newRequest(t, http.MethodPost, fr.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var events []string
	for range 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		_, _ = br.ReadString('\n')
		events = append(events, strings.TrimSpace(line))
		got <- struct{}{}
	}
	if diff := cmp.Diff([]string{"data: a", "data: b", "data: c"}, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if r := fr.result(t); r.err != nil || r.status != 200 {
		t.Errorf("Forward = %d, %v", r.status, r.err)
	}
}

func TestTrailersAndInformational(t *testing.T) {
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Trailer", "X-Tokens")
		_, _ = io.WriteString(w, "done")
		w.Header().Set("X-Tokens", "42")
	})
	fr := newFront(t, New(Options{}), be.URL, frontOptions{})
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, http.StatusText(code)+" "+h.Get("Link"))
		return nil
	}}
	req := newRequest(t, http.MethodGet, fr.URL, "")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	rep, body := get(t, fr.Client(), req)
	if body != "done" || rep.trailer.Get("X-Tokens") != "42" {
		t.Errorf("body %q, trailer X-Tokens %q; want done, 42", body, rep.trailer.Get("X-Tokens"))
	}
	if diff := cmp.Diff([]string{"Early Hints </style.css>; rel=preload"}, hints); diff != "" {
		t.Errorf("1xx answers (-want +got):\n%s", diff)
	}
	if rep.header.Get("Link") != "" {
		t.Errorf("the final answer has the 103's Link %q", rep.header.Get("Link"))
	}
	fr.result(t)
}

// A streamed request body (length unknown) goes in chunks, with its
// trailers; one of known length goes as it is.
func TestStreamedRequestBody(t *testing.T) {
	type seen struct {
		Body, Trailer string
		Length        int64
	}
	ch := make(chan seen, 1)
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- seen{string(b), r.Trailer.Get("X-Sum"), r.ContentLength}
	})
	fr := newFront(t, New(Options{}), be.URL, frontOptions{})
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, "part one, ")
		_, _ = io.WriteString(pw, "part two")
		_ = pw.Close()
	}()
	req := newRequest(t, http.MethodPut, fr.URL, "")
	req.Body, req.ContentLength = pr, -1
	req.Trailer = http.Header{"X-Sum": {"abc"}}
	get(t, fr.Client(), req)
	if diff := cmp.Diff(seen{"part one, part two", "abc", -1}, <-ch); diff != "" {
		t.Errorf("chunked (-want +got):\n%s", diff)
	}
	fr.result(t)
	get(t, fr.Client(), newRequest(t, http.MethodPut, fr.URL, "fixed"))
	if diff := cmp.Diff(seen{"fixed", "", 5}, <-ch); diff != "" {
		t.Errorf("fixed length (-want +got):\n%s", diff)
	}
	fr.result(t)
}

func TestNoBodyAnswers(t *testing.T) {
	be, conns := counting(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		if r.URL.Path == "/204" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_, _ = io.WriteString(w, "hello")
	})
	fr := newFront(t, New(Options{}), be.URL, frontOptions{})
	for _, tc := range []struct{ method, path string }{{"HEAD", "/"}, {"GET", "/204"}, {"GET", "/"}} {
		rep, body := get(t, fr.Client(), newRequest(t, tc.method, fr.URL+tc.path, ""))
		want := ""
		if tc.method == "GET" && tc.path == "/" {
			want = "hello"
		}
		if body != want {
			t.Errorf("%s %s: body %q, want %q", tc.method, tc.path, body, want)
		}
		if r := fr.result(t); r.err != nil || r.status != rep.status {
			t.Errorf("%s %s: Forward = %d, %v (client saw %d)", tc.method, tc.path, r.status, r.err, rep.status)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("%d connections, want 1: answers without a body leave the connection clean", got)
	}
}

func TestFailures(t *testing.T) {
	hijack := func(t *testing.T, write string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // the request was sent whole
			c, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = bw.WriteString(write)
			_ = bw.Flush()
			_ = c.Close()
		}
	}
	cases := map[string]struct {
		handler     func(t *testing.T) http.HandlerFunc
		wantErr     error
		wantStatus  int
		wantMsg     string
		wantDropped bool
	}{
		"closed before answering": {
			handler: func(t *testing.T) http.HandlerFunc { return hijack(t, "") },
			wantErr: ErrNoAnswer, wantMsg: "forward: backend failed before answering: EOF", wantDropped: true,
		},
		"reset before answering": {
			handler: func(t *testing.T) http.HandlerFunc { return testutil.CrashAfterRead(t, nil) },
			wantErr: ErrNoAnswer, wantMsg: "forward: backend failed before answering: read tcp ADDR: read: connection reset by peer", wantDropped: true,
		},
		"not HTTP": {
			handler: func(t *testing.T) http.HandlerFunc { return hijack(t, "SSH-2.0-OpenSSH\r\n\r\n") },
			wantErr: ErrNoAnswer, wantMsg: `forward: backend failed before answering: net/http: HTTP/1.x transport connection broken: malformed HTTP response "SSH-2.0-OpenSSH"`,
		},
		"cut after the headers": {
			handler: func(t *testing.T) http.HandlerFunc {
				return hijack(t, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
			},
			wantErr: ErrCut, wantStatus: 200, wantMsg: "forward: answer cut: unexpected EOF",
		},
		"cut chunked stream": {
			handler: func(t *testing.T) http.HandlerFunc {
				return hijack(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n7\r\ndata: a\r\n")
			},
			wantErr: ErrCut, wantStatus: 200, wantMsg: "forward: answer cut: unexpected EOF",
		},
		"switches protocols unasked": {
			handler: func(t *testing.T) http.HandlerFunc {
				return hijack(t, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			},
			wantErr: ErrNoAnswer, wantMsg: `forward: backend failed before answering: the backend switched to "websocket", the client asked for ""`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			be, _ := counting(t, tc.handler(t))
			fr := newFront(t, New(Options{}), be.URL, frontOptions{buffered: true})
			resp, err := fr.Client().Do(newRequest(t, http.MethodPost, fr.URL, "{}"))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			r := fr.result(t)
			if !errors.Is(r.err, tc.wantErr) || r.status != tc.wantStatus {
				t.Fatalf("Forward = %d, %v; want %d, %v", r.status, r.err, tc.wantStatus, tc.wantErr)
			}
			if msg := tcpAddrs.ReplaceAllString(r.err.Error(), "ADDR"); msg != tc.wantMsg {
				t.Errorf("error %q, want %q", msg, tc.wantMsg)
			}
			if got := Dropped(r.err); got != tc.wantDropped {
				t.Errorf("Dropped(%v) = %t, want %t", r.err, got, tc.wantDropped)
			}
		})
	}
}

// tcpAddrs matches the "local->remote" pair of a *net.OpError's message.
var tcpAddrs = regexp.MustCompile(`127\.0\.0\.1:\d+->127\.0\.0\.1:\d+`)

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	fr := newFront(t, New(Options{}), "http://"+addr, frontOptions{buffered: true})
	rep, _ := get(t, fr.Client(), newRequest(t, http.MethodPost, fr.URL, "{}"))
	r := fr.result(t)
	if !errors.Is(r.err, ErrUnreachable) || r.status != 0 {
		t.Fatalf("Forward = %d, %v; want 0, ErrUnreachable", r.status, r.err)
	}
	var op *net.OpError
	if !errors.As(r.err, &op) || op.Op != "dial" {
		t.Errorf("error %v does not carry the dial's *net.OpError", r.err)
	}
	// Nothing was written: the front handler's net/http sent its 200.
	if rep.status != http.StatusOK {
		t.Errorf("client saw %d", rep.status)
	}
}

// When the client leaves, the backend's connection closes: the backend
// sees its request cancelled.
func TestClientLeaves(t *testing.T) {
	arrived, cancelled := make(chan struct{}), make(chan struct{})
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
		// net/http watches for the connection closing once the body is read.
		_, _ = io.ReadAll(r.Body)
		close(arrived)
		<-r.Context().Done()
		close(cancelled)
	})
	fr := newFront(t, New(Options{}), be.URL, frontOptions{buffered: true})
	ctx, cancel := context.WithCancel(t.Context())
	req := newRequest(t, http.MethodPost, fr.URL, "{}").WithContext(ctx)
	errc := make(chan error, 1)
	go func() {
		resp, err := fr.Client().Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	cancel()
	<-cancelled
	r := fr.result(t)
	if !errors.Is(r.err, context.Canceled) || r.status != 0 {
		t.Errorf("Forward = %d, %v; want 0, context.Canceled", r.status, r.err)
	}
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v", err)
	}
}

// An upgrade the client asked for, and the front allows, becomes a
// two-way byte stream; one it does not allow never reaches the backend.
func TestUpgrade(t *testing.T) {
	upgrades := make(chan string, 2)
	be, _ := counting(t, func(w http.ResponseWriter, r *http.Request) {
		upgrades <- r.Header.Get("Upgrade")
		if r.Header.Get("Upgrade") == "" {
			_, _ = io.WriteString(w, "plain")
			return
		}
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_, _ = bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = bw.Flush()
		line, _ := bw.ReadString('\n')
		_, _ = bw.WriteString("echo " + line)
		_ = bw.Flush()
	})
	for _, allowed := range []bool{true, false} {
		fr := newFront(t, New(Options{}), be.URL, frontOptions{upgrade: allowed})
		c, err := net.Dial("tcp", strings.TrimPrefix(fr.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		// A 101's body is empty: the switched connection is c itself.
		defer resp.Body.Close()
		if got := <-upgrades; allowed != (got == "echo") {
			t.Errorf("allowed %v: the backend saw Upgrade %q", allowed, got)
		}
		if !allowed {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 5))
			if resp.StatusCode != http.StatusOK || string(b) != "plain" {
				t.Errorf("not allowed: %d %q, want 200 plain", resp.StatusCode, b)
			}
			_ = c.Close()
			fr.result(t)
			continue
		}
		if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo" {
			t.Fatalf("allowed: %d Upgrade %q, want 101 echo", resp.StatusCode, resp.Header.Get("Upgrade"))
		}
		_, _ = io.WriteString(c, "ping\n")
		line, err := br.ReadString('\n')
		if err != nil || line != "echo ping\n" {
			t.Errorf("through the switched connection: %q, %v", line, err)
		}
		_ = c.Close()
		if r := fr.result(t); r.err != nil || r.status != http.StatusSwitchingProtocols {
			t.Errorf("Forward = %d, %v; want 101, nil", r.status, r.err)
		}
	}
}

// flakyConn fails its writes once told to, as a connection the backend
// closed while it sat idle does; it is no syscall.Conn, so the idle check
// cannot see it coming and the write is what fails.
type flakyConn struct {
	net.Conn
	fail *atomic.Bool
}

func (c flakyConn) Write(b []byte) (int, error) {
	if c.fail.Load() {
		return 0, errors.New("write: broken pipe")
	}
	return c.Conn.Write(b)
}

// A request whose write fails on a reused connection goes once more on a
// new one when its body can be sent again; a streamed body cannot.
func TestResendsOnABrokenIdleConnection(t *testing.T) {
	var served atomic.Int64
	be, conns := counting(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		served.Add(1)
	})
	var dialed []*atomic.Bool
	var mu sync.Mutex
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		fail := new(atomic.Bool)
		dialed = append(dialed, fail)
		return flakyConn{c, fail}, nil
	}
	breakIdle := func() {
		mu.Lock()
		defer mu.Unlock()
		dialed[len(dialed)-1].Store(true)
	}
	for _, tc := range []struct {
		name     string
		buffered bool
		wantErr  error
		served   int64
	}{
		{"buffered", true, nil, 2},
		{"streamed", false, ErrNoAnswer, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			served.Store(0)
			conns.Store(0)
			fr := newFront(t, New(Options{Dial: dial}), be.URL, frontOptions{buffered: tc.buffered})
			get(t, fr.Client(), newRequest(t, http.MethodPost, fr.URL, "one"))
			if r := fr.result(t); r.err != nil {
				t.Fatal(r.err)
			}
			breakIdle()
			get(t, fr.Client(), newRequest(t, http.MethodPost, fr.URL, "two"))
			r := fr.result(t)
			if !errors.Is(r.err, tc.wantErr) || (tc.wantErr == nil) != (r.status == http.StatusOK) {
				t.Errorf("Forward = %d, %v; want %v", r.status, r.err, tc.wantErr)
			}
			if got := served.Load(); got != tc.served {
				t.Errorf("the backend served %d requests, want %d", got, tc.served)
			}
		})
	}
}

func TestHTTPSBackend(t *testing.T) {
	be := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "over TLS, "+r.Proto)
	}))
	t.Cleanup(be.Close)
	pool := x509.NewCertPool()
	pool.AddCert(be.Certificate())
	t.Run("trusted", func(t *testing.T) {
		fr := newFront(t, New(Options{TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}), be.URL, frontOptions{})
		rep, body := get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL, ""))
		if r := fr.result(t); r.err != nil || rep.status != http.StatusOK || body != "over TLS, HTTP/1.1" {
			t.Errorf("%d %q, Forward error %v", rep.status, body, r.err)
		}
	})
	t.Run("unknown authority", func(t *testing.T) {
		fr := newFront(t, New(Options{}), be.URL, frontOptions{})
		get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL, ""))
		r := fr.result(t)
		var unknown x509.UnknownAuthorityError
		if !errors.Is(r.err, ErrUnreachable) || !errors.As(r.err, &unknown) {
			t.Errorf("Forward error %v, want ErrUnreachable with x509.UnknownAuthorityError", r.err)
		}
		want := "forward: backend unreachable: TLS handshake with " + strings.TrimPrefix(be.URL, "https://") + ": tls: failed to verify certificate: x509: certificate signed by unknown authority"
		if r.err.Error() != want {
			t.Errorf("error %q, want %q", r.err, want)
		}
	})
}
