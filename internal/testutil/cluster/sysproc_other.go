//go:build !linux

package cluster

import "syscall"

// componentAttr puts a component in a process group of its own (Stop
// signals the group); only Linux can also tie its life to its parent's.
func componentAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
