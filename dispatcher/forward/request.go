package forward

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// writeRequest writes rq's head and body to the backend and flushes.
func (c *conn) writeRequest(rq *Request) error {
	in, bw := rq.In, c.bw
	bw.WriteString(in.Method)
	bw.WriteByte(' ')
	writeTarget(bw, rq)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(rq.Target.Host)
	bw.WriteString("\r\n")
	conn := in.Header["Connection"]
	for k, vv := range in.Header {
		if !endToEnd(k, conn) || notForwarded[k] {
			continue
		}
		for _, v := range vv {
			writeField(bw, k, v)
		}
	}
	if HasToken(in.Header["Te"], "trailers") {
		writeField(bw, "Te", "trailers")
	}
	if up := in.Header.Get("Upgrade"); rq.Upgrade && up != "" && HasToken(conn, "upgrade") {
		writeField(bw, "Connection", "Upgrade")
		writeField(bw, "Upgrade", up)
	}
	if rq.Body != nil || in.Body == nil || in.Body == http.NoBody {
		return c.writeFixed(rq)
	}
	if in.ContentLength > 0 {
		return c.writeStreamed(in)
	}
	return c.writeChunked(in)
}

// writeTarget writes the origin-form of the request's URL.
func writeTarget(bw *bufio.Writer, rq *Request) {
	u := rq.In.URL
	if p := u.EscapedPath(); p != "" {
		bw.WriteString(p)
	} else {
		bw.WriteByte('/')
	}
	if u.ForceQuery || u.RawQuery != "" {
		bw.WriteByte('?')
		bw.WriteString(u.RawQuery)
	}
}

func writeField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

// writeFixed ends the head with the length of a body held in memory (or
// none), then writes it.
func (c *conn) writeFixed(rq *Request) error {
	n := len(rq.Body)
	if n > 0 || bodyExpected(rq.In.Method) {
		c.bw.WriteString("Content-Length: ")
		c.bw.Write(strconv.AppendInt(c.scratch[:0], int64(n), 10))
		c.bw.WriteString("\r\n")
	}
	c.bw.WriteString("\r\n")
	c.bw.Write(rq.Body)
	return c.bw.Flush()
}

// bodyExpected says whether a request of method states an empty body's
// length (as net/http's client does).
func bodyExpected(method string) bool {
	return method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch
}

// errClientBody: the client's body could not be read while it streamed.
var errClientBody = errors.New("forward: reading the client's body")

// clientReader tells the client's read errors from the backend's write
// errors inside one io.Copy.
type clientReader struct{ r io.Reader }

func (c clientReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: %w", errClientBody, err)
	}
	return n, err
}

// writeStreamed copies a body of known length from the client.
func (c *conn) writeStreamed(in *http.Request) error {
	c.bw.WriteString("Content-Length: ")
	c.bw.Write(strconv.AppendInt(c.scratch[:0], in.ContentLength, 10))
	c.bw.WriteString("\r\n\r\n")
	n, err := io.Copy(c.bw, clientReader{in.Body})
	if err == nil && n != in.ContentLength {
		err = fmt.Errorf("%w: %d bytes of %d", errClientBody, n, in.ContentLength)
	}
	if err != nil {
		return err
	}
	return c.bw.Flush()
}

// writeChunked copies a body of unknown length from the client in chunks,
// with its trailers.
func (c *conn) writeChunked(in *http.Request) error {
	c.bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	buf := getBuffer()
	defer putBuffer(buf)
	for {
		n, err := in.Body.Read(*buf)
		if n > 0 {
			c.bw.Write(strconv.AppendInt(c.scratch[:0], int64(n), 16))
			c.bw.WriteString("\r\n")
			c.bw.Write((*buf)[:n])
			c.bw.WriteString("\r\n")
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errClientBody, err)
		}
	}
	c.bw.WriteString("0\r\n")
	for k, vv := range in.Trailer {
		for _, v := range vv {
			writeField(c.bw, k, v)
		}
	}
	c.bw.WriteString("\r\n")
	return c.bw.Flush()
}
