//go:build linux || darwin || freebsd || netbsd || openbsd

package forward

import (
	"errors"
	"io"
	"syscall"
)

// errReadable: an idle connection had bytes to read, out of turn.
var errReadable = errors.New("forward: idle connection has unread bytes")

// readable peeks at an idle socket without blocking or consuming: nil
// when nothing is there (open and idle), io.EOF when the peer closed it,
// errReadable or the socket's error otherwise.
func readable(rc syscall.RawConn) error {
	var buf [1]byte
	var perr error
	err := rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			perr = nil
		case err != nil:
			perr = err
		case n == 0:
			perr = io.EOF
		default:
			perr = errReadable
		}
		return true // never wait for readiness
	})
	if err != nil {
		return err
	}
	return perr
}
