package forward

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
)

// answer copies the backend's answer, whose head is resp, to the client.
func (ex *exchange) answer(resp *http.Response) (int, error) {
	w := ex.w
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return ex.switchProtocols(resp)
	}
	h := w.Header()
	copyAnswerHeader(h, resp.Header)
	announceTrailers(h, resp.Trailer)
	w.WriteHeader(resp.StatusCode)
	stream := resp.ContentLength < 0 || isEventStream(resp.Header)
	if stream && resp.Body != http.NoBody {
		// The client learns the status now, not with the first event.
		if err := flush(w); err != nil {
			return resp.StatusCode, fmt.Errorf("%w: %w", ErrClientGone, err)
		}
	}
	if err := copyBody(w, resp.Body, stream); err != nil {
		return resp.StatusCode, err
	}
	for k, vv := range resp.Trailer {
		if !HasToken(h["Trailer"], k) {
			k = http.TrailerPrefix + k
		}
		h[k] = vv
	}
	return resp.StatusCode, nil
}

// announceTrailers names the answer's trailers, so net/http sends them.
func announceTrailers(h http.Header, trailer http.Header) {
	if len(trailer) == 0 {
		return
	}
	names := make([]string, 0, len(trailer))
	for k := range trailer {
		names = append(names, k)
	}
	h["Trailer"] = []string{strings.Join(names, ", ")}
}

// isEventStream says whether the answer is Server-Sent Events.
func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	if !strings.HasPrefix(ct, "text/event-stream") {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// copyBody copies the answer's body to w, flushing after every read when
// it streams. A failed read is ErrCut's cause, a failed write ErrClientGone.
func copyBody(w http.ResponseWriter, body io.Reader, stream bool) error {
	if body == http.NoBody {
		return nil
	}
	pool := &copyBuffers
	if stream {
		pool = &streamBuffers
	}
	buf := pool.Get().(*[]byte)
	defer pool.Put(buf)
	for {
		n, rerr := body.Read(*buf)
		if n > 0 {
			if _, err := w.Write((*buf)[:n]); err != nil {
				return fmt.Errorf("%w: %w", ErrClientGone, err)
			}
			if stream {
				if err := flush(w); err != nil {
					return fmt.Errorf("%w: %w", ErrClientGone, err)
				}
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// flush sends what w buffers.
func flush(w http.ResponseWriter) error {
	switch fw := w.(type) {
	case interface{ FlushError() error }:
		return fw.FlushError()
	case http.Flusher:
		fw.Flush()
		return nil
	default:
		return http.NewResponseController(w).Flush()
	}
}

// copyBuffers are the 32 KiB buffers whole answers are copied through.
// streamBuffers are smaller: a stream holds its buffer for its whole
// length (minutes of decoding, thousands at once), and its events (an SSE
// chunk of a token is a few hundred bytes) come one read at a time anyway.
var (
	copyBuffers   = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
	streamBuffers = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}
)
