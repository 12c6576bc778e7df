//go:build !linux

package shell

import "syscall"

// setParentDeath does nothing where there is no parent-death signal.
func setParentDeath(*syscall.SysProcAttr) {}
