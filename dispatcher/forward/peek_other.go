//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package forward

import "syscall"

// peeker cannot peek here; a write that fails on a closed idle
// connection is retried on a new one instead.
type peeker struct{}

func newPeeker(syscall.RawConn) *peeker { return nil }

func (*peeker) readable() error { return nil }
