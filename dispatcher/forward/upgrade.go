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
// and bytes copied both ways, through the backend connection the
// Transport hands over as the 101's body, until either side closes.
func (ex *exchange) switchProtocols(resp *http.Response) (int, error) {
	rq, w := ex.rq, ex.w
	asked := rq.In.Header.Get("Upgrade")
	got := resp.Header.Get("Upgrade")
	backend, ok := resp.Body.(io.ReadWriteCloser)
	if !rq.Upgrade || asked == "" || !strings.EqualFold(asked, got) || !ok {
		return 0, fmt.Errorf("%w: the backend switched to %q, the client asked for %q", ErrNoAnswer, got, asked)
	}
	client, cbuf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return 0, fmt.Errorf("%w: cannot switch the client's connection: %w", ErrNoAnswer, err)
	}
	defer client.Close()
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
	head := &http.Response{StatusCode: http.StatusSwitchingProtocols, ProtoMajor: 1, ProtoMinor: 1, Header: h}
	if err := head.Write(cbuf); err != nil || cbuf.Flush() != nil {
		return http.StatusSwitchingProtocols, nil // the client left at once
	}
	splice(client, cbuf.Reader, backend)
	return http.StatusSwitchingProtocols, nil
}

// splice copies client → backend and backend → client until either
// direction ends, then closes both and waits for the other direction.
func splice(client net.Conn, fromClient *bufio.Reader, backend io.ReadWriteCloser) {
	done := make(chan struct{}, 2)
	pipe := func(dst io.Writer, src io.Reader) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(backend, fromClient)
	go pipe(client, backend)
	<-done
	_ = client.Close()
	_ = backend.Close()
	<-done
}
