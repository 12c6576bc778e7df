// Command couchjobs-peruser is the peruser plugin: a private database for
// every user of a CouchDB server. See plugins/peruser.
package main

import (
	"github.com/couchjobs/couchjobs/plugins/peruser"
	"github.com/couchjobs/couchjobs/sdk"
)

func main() { sdk.Serve(peruser.New()) }
