// Command couchjobs-indexing is the indexing plugin: CouchDB map/reduce
// views built as couchjobs jobs and served by the node. See
// plugins/indexing.
package main

import (
	"github.com/couchjobs/couchjobs/plugins/indexing"
	"github.com/couchjobs/couchjobs/sdk"
)

func main() { sdk.Serve(indexing.New()) }
