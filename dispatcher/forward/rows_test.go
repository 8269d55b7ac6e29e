package forward

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests of issue 21's table, each against a raw-socket backend (or a
// raw client) that misbehaves that way.

// A backend that writes a whole extra answer after a framed one (in a TLS
// record of its own over https) never gets it to another request: the
// connection is dropped, and the next request gets its own answer.
func TestStrayAnswerNeverReachesAnotherRequest(t *testing.T) {
	firsts := map[string]struct{ method, answer, body string }{
		"GET":  {http.MethodGet, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", "first"},
		"HEAD": {http.MethodHead, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", ""},
		"204":  {http.MethodGet, "HTTP/1.1 204 No Content\r\n\r\n", ""},
	}
	for _, https := range []bool{false, true} {
		for name, first := range firsts {
			t.Run(fmt.Sprintf("https=%v/%s", https, name), func(t *testing.T) {
				settled := make(chan struct{}, 1)
				var conns atomic.Int64
				be := newRawBackend(t, https, func(c net.Conn, br *bufio.Reader) {
					if conns.Add(1) > 1 {
						serveOwn(c, br)
						return
					}
					if readRequest(br) == nil {
						return
					}
					_, _ = io.WriteString(c, first.answer)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
					// Wait (bounded) for the dispatcher to drop the
					// connection, so that the next request is sent after
					// the stray answer arrived.
					closed := awaitClose(c, br, 5*time.Second)
					settled <- struct{}{}
					if !closed {
						serveOwn(c, br)
					}
				})
				fr := newFront(t, New(be.options(testOptions())), be.URL, frontOptions{})
				rep, body := get(t, fr.Client(), newRequest(t, first.method, fr.URL+"/a", ""))
				fr.result(t)
				if body != first.body {
					t.Errorf("first request: %d %q, want %q", rep.status, body, first.body)
				}
				<-settled
				for _, p := range []string{"/b", "/c"} {
					rep, body := get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL+p, ""))
					r := fr.result(t)
					if rep.status != http.StatusOK || body != "own:"+p || r.err != nil {
						t.Errorf("request %s got %d %q (Forward error %v), want 200 %q", p, rep.status, body, r.err, "own:"+p)
					}
				}
			})
		}
	}
}

// A backend that closes every keep-alive connection after answering,
// without saying Connection: close, fails at most 0.1% of idempotent
// requests from 20 parallel clients.
func TestKeepAliveCloseRace(t *testing.T) {
	be := newRawBackend(t, false, func(c net.Conn, br *bufio.Reader) {
		if req := readRequest(br); req != nil {
			_, _ = io.WriteString(c, ownAnswer(req))
		}
	})
	f := New(be.options(testOptions()))
	fr := newFront(t, f, be.URL, frontOptions{})
	// The front's results are not read: its channel is replaced by one
	// that is drained.
	go func() {
		for range fr.results {
		}
	}()
	const clients, each = 20, 50
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var failed, done atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for j := range each {
				p := fmt.Sprintf("/c%d/r%d", i, j)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fr.URL+p, nil)
				resp, err := fr.Client().Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				b, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || string(b) != "own:"+p {
					failed.Add(1)
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("only %d of %d requests done in time", done.Load(), clients*each)
	}
	t.Logf("%d of %d requests failed", failed.Load(), clients*each)
	if got, limit := failed.Load(), int64(clients*each/1000); got > limit {
		t.Errorf("%d of %d requests failed, want at most %d (0.1%%)", got, clients*each, limit)
	}
}

// A backend that sends 40 MB of response headers gets ErrNoAnswer once
// the head passes the limit, and the dispatcher holds no more of it than
// that.
func TestResponseHeaderFlood(t *testing.T) {
	const flood = 40 << 20
	line := "X-Flood: " + strings.Repeat("a", 1000) + "\r\n"
	chunk := []byte(strings.Repeat(line, 64))
	be := newRawBackend(t, false, func(c net.Conn, br *bufio.Reader) {
		if readRequest(br) == nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		for n := 0; n < flood; n += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
		_, _ = io.WriteString(c, "Content-Length: 2\r\n\r\nok")
	})
	fr := newFront(t, New(testOptions()), be.URL, frontOptions{})
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rep, _ := get(t, fr.Client(), newRequest(t, http.MethodGet, fr.URL, ""))
	r := fr.result(t)
	runtime.ReadMemStats(&after)
	if !errors.Is(r.err, ErrNoAnswer) || r.status != 0 {
		t.Fatalf("Forward = %d, %v; want 0, ErrNoAnswer (client saw %d)", r.status, r.err, rep.status)
	}
	if want := "server response headers exceeded 1048576 bytes"; !strings.Contains(r.err.Error(), want) {
		t.Errorf("error %q does not say %q", r.err, want)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
		t.Errorf("%d MiB allocated for the request, want at most 8 (the limit is 1 MiB)", got>>20)
	}
}

// A backend that answers 413 with Connection: close without reading a
// 12 MB body has its answer forwarded at once, while the client is still
// sending.
func TestEarlyFinalAnswer(t *testing.T) {
	const size = 12 << 20
	be := newRawBackend(t, false, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil { // the head only
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\nContent-Length: 9\r\n\r\ntoo large")
		select { // reads nothing more, and closes late
		case <-time.After(10 * time.Second):
		case <-t.Context().Done():
		}
	})
	fr := newFront(t, New(testOptions()), be.URL, frontOptions{})
	c, br := rawClient(t, fr.URL)
	var written atomic.Int64
	go func() {
		_, _ = fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
		buf := make([]byte, 64<<10)
		for written.Load() < size {
			n, err := c.Write(buf)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer in %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	took := time.Since(start)
	t.Logf("413 after %s, %d of %d bytes of the body written", took.Round(time.Millisecond), written.Load(), size)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too large" {
		t.Errorf("got %d %q, want 413 %q", resp.StatusCode, b, "too large")
	}
	if took > 3*time.Second {
		t.Errorf("the 413 took %s, want it within 3s", took)
	}
	if r := fr.result(t); r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("Forward = %d, %v; want 413", r.status, r.err)
	}
}

// statusLines reads every status line a raw client gets until the final
// answer (or the connection ends) and returns them.
func statusLines(t *testing.T, br *bufio.Reader) []string {
	t.Helper()
	var lines []string
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return lines
		}
		lines = append(lines, resp.Proto+" "+resp.Status)
		if resp.StatusCode >= 200 {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		_ = resp.Body.Close()
		if resp.StatusCode >= 200 {
			return lines
		}
	}
}

// 1xx answers reach HTTP/1.1 clients only, and at most maxInformational
// of them; a backend that sends more gets ErrNoAnswer.
func TestInformationalAnswers(t *testing.T) {
	hints := func(n int) script {
		return func(c net.Conn, br *bufio.Reader) {
			if readRequest(br) == nil {
				return
			}
			for range n {
				if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"); err != nil {
					return
				}
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}
	many := make([]string, 0, 6)
	for range 5 {
		many = append(many, "HTTP/1.1 103 Early Hints")
	}
	cases := map[string]struct {
		proto   string
		hints   int
		want    []string
		wantErr error
	}{
		"HTTP/1.0 client": {"HTTP/1.0", 1, []string{"HTTP/1.0 200 OK"}, nil},
		"HTTP/1.1 client": {"HTTP/1.1", 1, []string{"HTTP/1.1 103 Early Hints", "HTTP/1.1 200 OK"}, nil},
		"at the cap":      {"HTTP/1.1", 5, append(many[:5:5], "HTTP/1.1 200 OK"), nil},
		"a flood":         {"HTTP/1.1", 1000, many, ErrNoAnswer},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			be := newRawBackend(t, false, hints(tc.hints))
			fr := newFront(t, New(testOptions()), be.URL, frontOptions{})
			c, br := rawClient(t, fr.URL)
			_, _ = io.WriteString(c, "GET / "+tc.proto+"\r\nHost: x\r\n\r\n")
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := statusLines(t, br)
			r := fr.result(t)
			if !errors.Is(r.err, tc.wantErr) {
				t.Errorf("Forward error %v, want %v", r.err, tc.wantErr)
			}
			if tc.wantErr != nil {
				// The front's own 200 for a handler that wrote nothing
				// follows the hints; what matters is how many came.
				if len(got) > 0 && strings.HasSuffix(got[len(got)-1], "200 OK") {
					got = got[:len(got)-1]
				}
			}
			if diff := cmpDiff(tc.want, got); diff != "" {
				t.Errorf("status lines (-want +got):\n%s", diff)
			}
		})
	}
}
