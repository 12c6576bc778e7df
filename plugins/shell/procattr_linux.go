package shell

import "syscall"

// setParentDeath kills a command when the plugin dies, so that a killed
// node leaves no step running behind it (its own children may still need
// their process group killed, which a timeout does).
func setParentDeath(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
