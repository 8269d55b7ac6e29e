//go:build linux || darwin || freebsd || netbsd || openbsd

package forward

import (
	"errors"
	"io"
	"syscall"
)

// errReadable: an idle connection had bytes to read, out of turn.
var errReadable = errors.New("forward: idle connection has unread bytes")

// peeker looks at an idle socket without blocking or consuming.
type peeker struct {
	rc  syscall.RawConn
	buf [1]byte
	err error
	fn  func(fd uintptr) bool // p.peek, bound once
}

func newPeeker(rc syscall.RawConn) *peeker {
	p := &peeker{rc: rc}
	p.fn = p.peek
	return p
}

// readable is nil when nothing is there (open and idle), io.EOF when the
// peer closed it, errReadable or the socket's error otherwise.
func (p *peeker) readable() error {
	if err := p.rc.Read(p.fn); err != nil {
		return err
	}
	return p.err
}

func (p *peeker) peek(fd uintptr) bool {
	n, _, err := syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN):
		p.err = nil
	case err != nil:
		p.err = err
	case n == 0:
		p.err = io.EOF
	default:
		p.err = errReadable
	}
	return true // never wait for readiness
}
