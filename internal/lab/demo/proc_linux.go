package demo

import "syscall"

// childAttr puts the dispatcher in a process group of its own, so that a
// ^C in the terminal reaches the demo alone (which stops the child in
// order), and has the kernel kill it should the demo die first.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
