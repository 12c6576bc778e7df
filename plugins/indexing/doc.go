// Package indexing is the couchjobs job type that builds CouchDB
// map/reduce views, as CouchDB 4.x's couch_views does on couch_jobs: a
// watcher job per configured database follows its design documents, an
// index job per (server, database, signature) builds the index
// incrementally from the database's changes feed into the plugin's
// subspace of the store, and the node serves view queries from it
// (GET/POST /{db}/_design/{ddoc}/_view/{view}).
//
// The store layout, the reduce tree and the consistency argument are in
// docs/ARCHITECTURE.md ("Indexing").
package indexing
