// Package forward sends one client request to a backend over HTTP/1.1 and
// copies the backend's answer back, on the caller's goroutine.
//
// It is the dispatcher's hand-written replacement for httputil.ReverseProxy
// over http.Transport. That pair hands every request to two goroutines per
// backend connection (a write loop and a read loop) and back through
// channels; on a machine with few cores those handoffs were most of what
// the proxy added to a request's tail. Here the request is written and the
// answer read by the goroutine that serves the client, and a connection is
// only ever touched by one request at a time.
//
// What it keeps of a reverse proxy's contract:
//   - hop-by-hop headers (RFC 9110 section 7.6.1: Connection and the
//     fields it names, Keep-Alive, Proxy-*, TE but "trailers", Trailer,
//     Transfer-Encoding, Upgrade) are dropped both ways, and so are the
//     client's Forwarded and X-Forwarded-* (the dispatcher vouches for
//     nothing they say); Expect is answered by net/http and not passed on;
//   - a streamed answer (no Content-Length, or text/event-stream) is
//     flushed to the client after every read from the backend, so SSE
//     events and tokens are never held back;
//   - 1xx answers other than 101 are passed on; trailers are passed on;
//   - a 101 to a request that asked for that upgrade switches the client's
//     connection and copies bytes both ways until either side closes;
//   - when the client leaves, the backend connection is closed at once, so
//     the backend sees the generation cancelled.
//
// Connections: idle keep-alive connections are pooled per backend
// (scheme and host:port), at most MaxIdleConnsPerHost each, closed after
// IdleConnTimeout. A pooled connection is checked before reuse (one
// non-blocking read: a backend that closed it shows EOF), so a request is
// not sent down a connection that is already gone; a request whose write
// to a reused connection fails is sent once more on a new one, since a
// backend never processes a request it did not receive whole. Anything
// else that fails is the caller's to decide on, by the sentinel error
// returned: ErrUnreachable (nothing was sent: safe to try elsewhere),
// ErrNoAnswer (the backend failed before its headers), ErrCut (the answer
// was cut after its headers were written to the client) and ErrClientGone
// (the client failed: its streamed body, or the copy of the answer to it;
// the backend is not to blame).
//
// Concurrency model: Forward may be called from any number of goroutines.
// The idle pools are guarded by one mutex, held only to take or return a
// connection; a connection in use belongs to its request's goroutine, and
// a context.AfterFunc interrupts it when the client leaves.
package forward
