package forward

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// switchProtocols completes a 101: when the client asked for that
// protocol, its connection is taken from net/http, the 101 written to it,
// and bytes copied both ways until either side closes.
func (f *Forwarder) switchProtocols(w http.ResponseWriter, c *conn, rq *Request, resp *http.Response) (int, error) {
	asked := rq.In.Header.Get("Upgrade")
	got := resp.Header.Get("Upgrade")
	if !rq.Upgrade || asked == "" || !strings.EqualFold(asked, got) {
		return 0, fmt.Errorf("%w: the backend switched to %q, the client asked for %q", ErrNoAnswer, got, asked)
	}
	client, cbuf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return 0, fmt.Errorf("%w: cannot switch the client's connection: %w", ErrNoAnswer, err)
	}
	defer client.Close()
	c.release()
	_ = c.SetDeadline(time.Time{})
	_ = client.SetDeadline(time.Time{})
	h := make(http.Header, len(resp.Header))
	copyHeader(h, w.Header())
	for k, vv := range resp.Header {
		if endToEnd(k, resp.Header["Connection"]) {
			h[k] = vv
		}
	}
	h["Connection"] = []string{"Upgrade"}
	h["Upgrade"] = []string{got}
	cbuf.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	if err := h.Write(cbuf); err != nil {
		return http.StatusSwitchingProtocols, err
	}
	cbuf.WriteString("\r\n")
	if err := cbuf.Flush(); err != nil {
		return http.StatusSwitchingProtocols, nil // the client left at once
	}
	splice(client, cbuf.Reader, c.Conn, c.br)
	return http.StatusSwitchingProtocols, nil
}

// splice copies client → backend and backend → client until either
// direction ends, then closes both and waits for the other direction.
func splice(client net.Conn, fromClient *bufio.Reader, backend net.Conn, fromBackend *bufio.Reader) {
	done := make(chan struct{}, 2)
	pipe := func(dst net.Conn, src io.Reader) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(backend, fromClient)
	go pipe(client, fromBackend)
	<-done
	_ = client.Close()
	_ = backend.Close()
	<-done
}
