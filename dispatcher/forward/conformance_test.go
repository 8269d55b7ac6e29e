package forward

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// after is what a misbehaving backend does once it wrote its answer.
type after int

const (
	keepOpen after = iota // serves later requests on the connection correctly
	closeConn
	resetConn // closes with SO_LINGER 0: the dispatcher sees a reset
)

// misbehaviour is a backend whose answer to the first request is raw
// bytes (EVIL marks every byte that must never reach another request).
type misbehaviour struct {
	method  string // of the first request; GET when empty
	answer  string
	extra   string // written after answer, in a write (a TLS record) of its own
	trickle bool   // written a byte at a time
	then    after
}

// misbehaving is the script of m: the first request on the backend gets
// m.answer, every other request its own answer. When the answer leaves
// bytes on the connection (or breaks its framing) the script waits for the
// dispatcher to drop it, so that the next request is sent after the stray
// bytes arrived, and sets dirty if it was kept; settled is signalled once
// that is known.
func misbehaving(m misbehaviour, dirty *atomic.Bool, settled chan<- struct{}) script {
	var requests atomic.Int64
	clean := framedExactly(m.answer+m.extra, m.method)
	return func(c net.Conn, br *bufio.Reader) {
		if requests.Add(1) > 1 {
			serveOwn(c, br)
			return
		}
		if readRequest(br) == nil {
			return
		}
		writeAnswer(c, m.answer, m.trickle)
		if m.extra != "" {
			writeAnswer(c, m.extra, m.trickle)
		}
		switch {
		case m.then == closeConn:
		case m.then == resetConn:
			reset(c)
		case clean:
			close(settled) // a connection the dispatcher may keep
			serveOwn(c, br)
			return
		default:
			// The dispatcher must drop this connection: the event waited
			// for, bounded.
			closed := awaitClose(c, br, 5*time.Second)
			dirty.Store(!closed)
			close(settled)
			if !closed {
				serveOwn(c, br)
			}
			return
		}
		close(settled)
	}
}

// framedExactly says whether answer is a series of 1xx answers and one
// final answer to a request of method that uses up every byte and lets
// the connection be kept: net/http's reading of it is the oracle.
func framedExactly(answer, method string) bool {
	if method == "" {
		method = http.MethodGet
	}
	br := bufio.NewReader(strings.NewReader(answer))
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return false
		}
		if resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			_ = resp.Body.Close()
			continue
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return false
		}
		_, err = br.Peek(1)
		return !resp.Close && resp.StatusCode != http.StatusSwitchingProtocols && errors.Is(err, io.EOF)
	}
}

func writeAnswer(c net.Conn, answer string, trickle bool) {
	if !trickle {
		_, _ = io.WriteString(c, answer)
		return
	}
	for i := range len(answer) {
		if _, err := io.WriteString(c, answer[i:i+1]); err != nil {
			return
		}
	}
}

// reset makes the connection's close a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// evilAnswer is a whole answer that no request asked for.
const evilAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"

// conformance are the misbehaving backends of the suite.
var conformance = map[string]misbehaviour{
	"extra bytes after Content-Length":  {answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", extra: "EVIL"},
	"an answer after Content-Length":    {answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", extra: evilAnswer},
	"an answer in the same write":       {answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + evilAnswer},
	"an answer after Connection: close": {answer: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", extra: evilAnswer},
	"HEAD with a body":                  {method: http.MethodHead, answer: "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"},
	"HEAD with an answer for a body":    {method: http.MethodHead, answer: "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", extra: evilAnswer},
	"204 with a body":                   {answer: "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n", extra: "EVIL"},
	"204 with an answer for a body":     {answer: "HTTP/1.1 204 No Content\r\n\r\n", extra: evilAnswer},
	"304 with a body":                   {answer: "HTTP/1.1 304 Not Modified\r\n\r\n", extra: evilAnswer},
	"Content-Length and chunked":        {answer: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nEVIL\r\n0\r\n\r\nEVIL"},
	"two Content-Lengths":               {answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 4\r\n\r\nEVIL"},
	"a negative Content-Length":         {answer: "HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\nEVIL"},
	"a bad chunk size":                  {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nEVIL\r\n0\r\n\r\n"},
	"an overflowing chunk size":         {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\nEVIL\r\n0\r\n\r\n"},
	"a chunk longer than it says":       {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nEVIL\r\n0\r\n\r\n"},
	"chunks without their end":          {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nEVIL\r\n", then: closeConn},
	"a smuggled trailer":                {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nEVIL\r\n0\r\nX-Tiergate-Tenant: b\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"},
	"an unknown transfer coding":        {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked, identity\r\n\r\n4\r\nEVIL\r\n0\r\n\r\n"},
	"a flood of 1xx":                    {answer: repeat("HTTP/1.1 103 Early Hints\r\nLink: </EVIL>\r\n\r\n", 200) + "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"},
	"an unasked 100 Continue":           {answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"},
	"an unasked 101":                    {answer: "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: EVIL\r\n\r\nEVIL"},
	"a status out of range":             {answer: "HTTP/1.1 2000 OK\r\nContent-Length: 4\r\n\r\nEVIL"},
	"not HTTP":                          {answer: "SSH-2.0-EVIL\r\n\r\n"},
	"HTTP/0.9":                          {answer: "EVIL"},
	"an obsolete line folding":          {answer: "HTTP/1.1 200 OK\r\nX-A: a\r\n EVIL\r\nContent-Length: 4\r\n\r\nEVIL"},
	"a NUL in a header":                 {answer: "HTTP/1.1 200 OK\r\nX-A: \x00EVIL\r\nContent-Length: 4\r\n\r\nEVIL"},
	"bare LF line ends":                 {answer: "HTTP/1.1 200 OK\nContent-Length: 4\n\nEVILEVIL"},
	"HTTP/1.0 read to the close":        {answer: "HTTP/1.0 200 OK\r\n\r\nEVIL", then: closeConn},
	"a short body, then a close":        {answer: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nEVIL", then: closeConn},
	"a short body, then a reset":        {answer: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nEVIL", then: resetConn},
	"a short body, kept open":           {answer: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nEVIL"},
	"a close before answering":          {then: closeConn},
	"a reset before answering":          {then: resetConn},
	"half a head, then a close":         {answer: "HTTP/1.1 200 OK\r\nContent-Le", then: closeConn},
	"a trickled answer":                 {answer: "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL", trickle: true},
	"a trickled answer with extra":      {answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", extra: evilAnswer, trickle: true},
	"a trickled chunked stream":         {answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n4\r\nEVIL\r\n4\r\nEVIL\r\n0\r\n\r\n", trickle: true},
}

func repeat(s string, n int) string {
	b := make([]byte, 0, len(s)*n)
	for range n {
		b = append(b, s...)
	}
	return string(b)
}

// TestConformance: whatever a backend does to one request, the next
// request, from another tenant, gets its own answer, over http and https.
func TestConformance(t *testing.T) {
	for _, https := range []bool{false, true} {
		for name, m := range conformance {
			t.Run(fmt.Sprintf("https=%v/%s", https, name), func(t *testing.T) {
				checkNextGetsItsOwn(t, https, m)
			})
		}
	}
}

// checkNextGetsItsOwn sends a request from tenant a to a backend that
// misbehaves as m, then two from tenants b and c, which must get their
// own answers.
func checkNextGetsItsOwn(t *testing.T, https bool, m misbehaviour) {
	t.Helper()
	method := m.method
	if method == "" {
		method = http.MethodGet
	}
	var dirty atomic.Bool
	settled := make(chan struct{})
	be := newRawBackend(t, https, misbehaving(m, &dirty, settled))
	fr := newFront(t, New(be.options(testOptions())), be.URL, frontOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, method, fr.URL+"/a", nil)
	req.Header.Set("X-Tiergate-Tenant", "a")
	if resp, err := fr.Client().Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	cancel()
	first := fr.result(t)
	select {
	case <-settled:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the backend")
	}
	fr.Client().CloseIdleConnections()
	for _, tenant := range []string{"b", "c"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, fr.URL+"/"+tenant, nil)
		req.Header.Set("X-Tiergate-Tenant", tenant)
		resp, err := fr.Client().Do(req)
		if err != nil {
			t.Fatalf("tenant %s: %v (the first request ended %d, %v)", tenant, err, first.status, first.err)
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		r := fr.result(t)
		want := "own:/" + tenant + "@" + tenant
		if err != nil || resp.StatusCode != http.StatusOK || string(b) != want || r.err != nil {
			t.Errorf("tenant %s got %d %q (read error %v, Forward error %v), want 200 %q; the first request ended %d, %v",
				tenant, resp.StatusCode, b, err, r.err, want, first.status, first.err)
		}
	}
	if dirty.Load() {
		t.Errorf("the dispatcher kept a connection with bytes left on it, or broken framing, for 5s (the first request ended %d, %v)", first.status, first.err)
	}
}
