package cluster

import "syscall"

// componentAttr puts a component in a process group of its own (Stop
// signals the group) and has the kernel kill it if the process that
// started it dies without stopping it: a SIGKILLed demo or test binary
// leaves no kube-controller-manager, kube-scheduler or kwok behind.
func componentAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
