// Package forward sends one client request to a backend through net/http's
// Transport and copies the backend's answer back: a thin layer over
// http.Transport.RoundTrip, not httputil.ReverseProxy, because the
// dispatcher needs to know how an exchange failed (ErrUnreachable,
// ErrNoAnswer, ErrTimeout, ErrCut or ErrClientGone: the balancer's
// outcome, the retry elsewhere and the answer the client gets depend on
// it), where ReverseProxy ends every broken copy in the same panic, and
// it needs to decide which 1xx answers reach the client.
//
// The Transport does the HTTP: framing both ways, keep-alive pooling (it
// reads every idle connection, so a backend that closes one or writes out
// of turn loses it before a request is sent down it), resending an
// idempotent request whose reused connection broke, and the limits of
// Options. It speaks HTTP/1.1 only to backends, asks for no compression
// and uses no proxy.
//
// What this package adds:
//   - hop-by-hop headers (RFC 9110 section 7.6.1: Connection and the
//     fields it names, Keep-Alive, Proxy-*, TE but "trailers", Trailer,
//     Transfer-Encoding, Upgrade) are dropped both ways, but the fields
//     the dispatcher set (Request.Protected) are sent whatever Connection
//     names; the client's Forwarded and X-Forwarded-* are dropped (the
//     dispatcher vouches for nothing they say); Expect was net/http's to
//     answer and is not passed on;
//   - a streamed answer (no Content-Length, or text/event-stream) is
//     flushed to the client after every read from the backend, so SSE
//     events and tokens are never held back;
//   - 1xx answers other than 101 are passed on to HTTP/1.1 clients only
//     (never to an HTTP/1.0 one), at most maxInformational per request; a
//     backend that sends more gets ErrNoAnswer. Trailers are passed on;
//   - a 101 to a request that asked for that upgrade switches the client's
//     connection and copies bytes both ways until either side closes;
//   - when the client leaves, the request's context ends the Transport's
//     exchange, which closes the backend connection, so the backend sees
//     the generation cancelled;
//   - a streamed client body's read errors are ErrClientBody (with
//     ErrClientGone): the client's fault, never the backend's;
//   - a request whose write to a reused connection failed (the backend
//     closed it as it was taken) is sent once more when its body is in
//     memory: the backend never had it whole. The Transport resends only
//     requests it wrote nothing of, or idempotent ones.
//
// What the Transport cannot rule out: a stray answer that arrives in the
// instant between the end of one answer and the Transport's read loop
// looking at the idle connection again can be read as the answer of a
// request that takes the connection in that instant (HTTP/1.1 gives an
// answer nothing that names its request). One that arrives before the
// next request is taken closes the connection.
//
// Concurrency model: Forward may be called from any number of goroutines;
// the Transport's pool is its own. During one Forward the Transport's
// goroutines read the client's streamed body and pass 1xx answers on;
// Forward returns only once the Transport has closed that body, and a
// mutex ends the passing on of 1xx answers when RoundTrip returns, so
// after Forward nothing touches the request or the ResponseWriter.
package forward
