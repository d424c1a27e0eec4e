//go:build !linux

package demo

import "syscall"

// childAttr puts the dispatcher in a process group of its own, so that a
// ^C in the terminal reaches the demo alone, which stops the child in
// order.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
