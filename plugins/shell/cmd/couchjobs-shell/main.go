// Command couchjobs-shell is the shell plugin: jobs of ordered shell
// steps. Build it into the host's plugin directory; see plugins/shell.
package main

import (
	"github.com/couchjobs/couchjobs/plugins/shell"
	"github.com/couchjobs/couchjobs/sdk"
)

func main() { sdk.Serve(shell.New()) }
