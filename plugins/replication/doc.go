// Package replication is CouchDB's replicator as a couchjobs job type:
// the replication protocol (changes, _revs_diff, _bulk_get or open_revs,
// _bulk_docs with new_edits=false, checkpoints in _local documents on both
// ends), persistent replications from _replicator databases, transient
// ones from POST /_replicate, and CouchDB's monitoring endpoints, run as
// CouchDB 4.x runs them on couch_jobs. See README.md.
package replication
