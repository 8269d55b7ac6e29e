package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/budget"
)

// readBody reads the whole body, charging it to c as it arrives (see
// readAll). It returns (nil, nil) when the client went away while sending
// it. tier names the refusal of a body the budget has no room for.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, tier string, c *budget.Charge) ([]byte, *apierror.Error) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		w.Header().Set("Connection", "close")
		return nil, apierror.BodyTooLarge(s.cfg.MaxBodyBytes)
	}
	if r.ContentLength > 0 && !s.bodies.Fits(r.ContentLength) {
		// Refused before a byte is read, so a client that waits for
		// "100 Continue" sends nothing. The declared length only decides
		// this; it reserves nothing.
		w.Header().Set("Connection", "close")
		return nil, apierror.Overloaded(tier, s.bodies.Limit())
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	// Reading to EOF also starts net/http's watch for the client closing
	// the connection, which Wait relies on while the request is queued.
	body, err := readAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength, s.cfg.MaxBodyBytes, c)
	if err != nil {
		// Leave the read deadline as it is and close the connection: what
		// is left of this body is not worth waiting for.
		w.Header().Set("Connection", "close")
		var tooBig *http.MaxBytesError
		switch {
		case errors.Is(err, budget.ErrExceeded):
			return nil, apierror.Overloaded(tier, s.bodies.Limit())
		case errors.As(err, &tooBig):
			return nil, apierror.BodyTooLarge(s.cfg.MaxBodyBytes)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, apierror.RequestTimeout(s.cfg.BodyTimeout)
		case r.Context().Err() != nil:
			return nil, nil
		default:
			return nil, apierror.BadRequest("could not read the request body: " + err.Error())
		}
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, nil
}

// firstChunk is the buffer a body starts with.
const firstChunk = 4 << 10

// readAll reads r to EOF into a buffer that grows as the body arrives:
// it doubles, from firstChunk, up to the declared length (length >= 0) or
// limit, each growth charged to c before it is made. What c holds is the
// buffer's capacity: at most twice what arrived, plus firstChunk, and
// never more than the declared length or limit, so a large declared
// length costs nothing until its bytes come. A growth the budget has no
// room for ends the read with budget.ErrExceeded. It never returns a nil
// slice without an error.
func readAll(r io.Reader, length, limit int64, c *budget.Charge) ([]byte, error) {
	size := limit
	if length >= 0 {
		size = length
	}
	buf := []byte{}
	for int64(len(buf)) < size {
		if len(buf) == cap(buf) {
			var err error
			if buf, err = grow(buf, size, c); err != nil {
				return nil, err
			}
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			if int64(len(buf)) < length {
				return nil, fmt.Errorf("the body ended before its Content-Length: %w", io.ErrUnexpectedEOF)
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
	// Full: only EOF may follow (more is too large, or longer than the
	// declared length).
	var probe [1]byte
	switch _, err := io.ReadFull(r, probe[:]); {
	case errors.Is(err, io.EOF):
		return buf, nil
	case err == nil:
		return nil, errors.New("the body is longer than its Content-Length")
	default:
		return nil, err
	}
}

// grow gives buf twice its capacity (firstChunk at first), at most size,
// once c has been charged the difference.
func grow(buf []byte, size int64, c *budget.Charge) ([]byte, error) {
	n := min(size, max(firstChunk, 2*int64(cap(buf))))
	if err := c.Grow(n - int64(cap(buf))); err != nil {
		return nil, err
	}
	out := make([]byte, len(buf), n)
	copy(out, buf)
	return out, nil
}

// discardBody reads what is left of a refused body and throws it away,
// after sending the refusal: most clients (Go's and Python's among them)
// report a write error instead of the answer when the server closes while
// they still send, so the rest is read, holding nothing (nginx's lingering
// close does the same). It is bounded by MaxBodyBytes and BodyTimeout. A
// client that waits for "100 Continue" and was refused before any byte was
// read sends no body, so there is nothing to wait for.
func (s *Server) discardBody(w http.ResponseWriter, r *http.Request, began bool) {
	if !began && r.Header.Get("Expect") != "" {
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
}
