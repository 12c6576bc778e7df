package replication_test

import (
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/plugins/replication"
)

// FuzzParse: any replication document either parses into a runnable
// spec, whose public view never holds a password, or fails with a reason.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"source":"http://u:secretpw@h:5984/a","target":"http://h/b","continuous":true}`,
		`{"source":{"url":"https://h/a","headers":{"Authorization":"Basic eA=="},"auth":{"basic":{"username":"u","password":"secretpw"}}},"target":"http://h/b"}`,
		`{"source":"http://h/a","target":"http://h/b","filter":"d/f","query_params":{"x":1}}`,
		`{"source":"http://h/a","target":"http://h/b","doc_ids":["a"],"worker_processes":2,"since_seq":"3-g1"}`,
		`{"source":"db","target":5}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		spec, err := replication.Parse(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a reason")
			}
			return
		}
		v := spec.View()
		for _, pw := range []string{spec.Source.Password, spec.Target.Password} {
			if len(pw) >= 4 && !strings.Contains("*****", pw) && (strings.Contains(v.Source, pw) || strings.Contains(v.Target, pw)) {
				t.Fatalf("the view shows a password: %+v", v)
			}
		}
		o := spec.Options
		if o.WorkerProcesses < 1 || o.WorkerBatchSize < 1 || o.HTTPConnections < 1 || o.CheckpointInterval < 1 || o.ConnectionTimeout < 1 {
			t.Fatalf("a spec that cannot run: %+v", o)
		}
		_ = replication.ReplicationID(spec, "")
	})
}
