// Command couchjobs-replication is the replication plugin: CouchDB's
// replicator as couchjobs jobs. See plugins/replication.
package main

import (
	"github.com/couchjobs/couchjobs/plugins/replication"
	"github.com/couchjobs/couchjobs/sdk"
)

func main() { sdk.Serve(replication.New()) }
