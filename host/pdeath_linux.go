package host

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal has the kernel kill the plugin if the host dies, even
// by SIGKILL, so that no plugin outlives its host.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
