package host

import (
	"os/exec"
	"syscall"
)

// setProcAttr detaches a plugin from the host's signals and ties it to the
// host's life. In a process group of its own, a plugin does not get the
// Ctrl-C or SIGTERM sent to the host's group, so the host can drain its
// jobs before stopping it; and the kernel kills it if the host dies, even
// by SIGKILL, so that no plugin outlives its host.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
