//go:build !linux

package host

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts a plugin in a process group of its own, so that signals
// to the host's group do not reach it. Without a parent-death signal on
// this system, the SDK's plugins watch their parent process themselves.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
