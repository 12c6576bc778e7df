package indexing

// MarkerKey is the key of an index's marker, for tests that check an
// index is gone.
func MarkerKey(server, db, sig string) []byte { return newIndex(server, db, sig).marker() }
