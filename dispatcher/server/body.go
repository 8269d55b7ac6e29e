package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/tiergate/tiergate/dispatcher/apierror"
)

// readBody reads the whole body. It returns (nil, nil) when the client went
// away while sending it.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apierror.Error) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		w.Header().Set("Connection", "close")
		return nil, apierror.BodyTooLarge(s.cfg.MaxBodyBytes)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	// Reading to EOF also starts net/http's watch for the client closing
	// the connection, which Wait relies on while the request is queued.
	body, err := readAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength)
	if err != nil {
		// Leave the read deadline as it is and close the connection: what
		// is left of this body is not worth waiting for.
		w.Header().Set("Connection", "close")
		var tooBig *http.MaxBytesError
		switch {
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

// readAll reads r to EOF. With a known length it allocates exactly that
// much: a queued request keeps its body, so slack would be paid per
// queued request. It never returns a nil slice without an error.
func readAll(r io.Reader, length int64) ([]byte, error) {
	if length < 0 {
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(r); err != nil {
			return nil, err
		}
		return append([]byte{}, buf.Bytes()...), nil
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("the body ended before its Content-Length: %w", err)
		}
		return nil, err
	}
	var probe [1]byte
	if n, err := r.Read(probe[:]); n > 0 || (err != nil && !errors.Is(err, io.EOF)) {
		if err == nil {
			err = errors.New("the body is longer than its Content-Length")
		}
		return nil, err
	}
	return body, nil
}
