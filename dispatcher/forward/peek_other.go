//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package forward

import "syscall"

// readable cannot peek here; a write that fails on a closed idle
// connection is retried on a new one instead.
func readable(syscall.RawConn) error { return nil }
