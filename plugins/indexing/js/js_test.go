package js_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/indexing/js"
)

func rows(t *testing.T, rs []js.Row) string {
	t.Helper()
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(string(r.Key) + "=" + string(r.Value) + ";")
	}
	return b.String()
}

func TestMap(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, src, doc, want string
	}{
		{"emit", `function(doc) { emit(doc._id, doc.n); }`, `{"_id":"a","n":1}`, `"a"=1;`},
		{"many emits and keys of every type", `function(doc) { emit(null, 1); emit(true); emit([1, "x", {"a": [null]}], doc); emit(1.5, "é"); }`,
			`{"_id":"a"}`, `null=1;true=null;[1,"x",{"a":[null]}]={"_id":"a"};1.5="é";`},
		{"no emit", `function(doc) { if (doc.type == "x") emit(1, 1); }`, `{"_id":"a"}`, ``},
		{"sum, isArray, toJSON", `function(doc) { emit(sum(doc.v), isArray(doc.v)); emit(toJSON(doc.v), isArray(doc)); }`,
			`{"v":[1,2,3.5]}`, `6.5=true;"[1,2,3.5]"=false;`},
		{"big numbers stay numbers", `function(doc) { emit(doc.big, doc.neg); }`, `{"big":12345678901,"neg":-0.25}`, `12345678901=-0.25;`},
		{"CouchDB style with a newline comment", "function(doc) { emit(doc._id, null); } // done", `{"_id":"b"}`, `"b"=null;`},
	}
	for _, c := range cases {
		m, err := js.CompileMap(c.src, js.Limits{}, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := m.Run([]byte(c.doc))
		if err != nil || rows(t, got) != c.want {
			t.Errorf("%s: %s %v; want %s", c.name, rows(t, got), err, c.want)
		}
	}
}

func TestMapErrors(t *testing.T) {
	t.Parallel()
	var logged []string
	for _, src := range []string{`function(doc) {`, `42`, `"not a function"`} {
		if _, err := js.CompileMap(src, js.Limits{}, nil); !errors.Is(err, js.ErrCompile) {
			t.Errorf("%q: %v", src, err)
		}
	}
	m, err := js.CompileMap(`function(doc) { log("seen " + doc._id); if (doc.bad) throw new Error("bad doc"); emit(doc._id, 1); }`, js.Limits{}, func(s string) { logged = append(logged, s) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Run([]byte(`{"_id":"x","bad":true}`)); !errors.Is(err, js.ErrThrew) || !strings.Contains(err.Error(), "bad doc") {
		t.Errorf("throw: %v", err)
	}
	// The function goes on with the next document.
	if got, err := m.Run([]byte(`{"_id":"y"}`)); err != nil || rows(t, got) != `"y"=1;` {
		t.Errorf("after a throw: %s %v", rows(t, got), err)
	}
	if len(logged) != 2 || logged[1] != "seen y" {
		t.Errorf("log: %q", logged)
	}
	if _, err := m.Run([]byte(`[1]`)); !errors.Is(err, js.ErrBadDoc) {
		t.Errorf("not an object: %v", err)
	}
}

func TestMapLimits(t *testing.T) {
	t.Parallel()
	loop, err := js.CompileMap(`function(doc) { while (true) {} }`, js.Limits{Timeout: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := loop.Run([]byte(`{}`)); !errors.Is(err, js.ErrTimeout) {
		t.Errorf("runaway: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stopped after %v", d)
	}
	big, err := js.CompileMap(`function(doc) { for (var i = 0; ; i++) emit(i, "0123456789"); }`, js.Limits{MaxEmitBytes: 10000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := big.Run([]byte(`{}`)); !errors.Is(err, js.ErrTooLarge) {
		t.Errorf("emit flood: %v", err)
	}
	// A limit stops the call, not the function.
	ok, err := js.CompileMap(`function(doc) { if (doc.spin) while (true) {} ; emit(1, 2); }`, js.Limits{Timeout: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ok.Run([]byte(`{"spin":true}`)); !errors.Is(err, js.ErrTimeout) {
		t.Errorf("spin: %v", err)
	}
	if got, err := ok.Run([]byte(`{}`)); err != nil || rows(t, got) != `1=2;` {
		t.Errorf("after a timeout: %s %v", rows(t, got), err)
	}
}

func BenchmarkMap(b *testing.B) {
	m, err := js.CompileMap(`function(doc) { if (doc.type === "post") emit([doc.author, doc.date], doc.title); }`, js.Limits{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	doc := []byte(`{"_id":"p1","_rev":"1-x","type":"post","author":"ann","date":"2026-11-22","title":"On views","body":"lorem ipsum dolor sit amet"}`)
	for b.Loop() {
		if _, err := m.Run(doc); err != nil {
			b.Fatal(err)
		}
	}
}

func TestReduce(t *testing.T) {
	t.Parallel()
	r, err := js.CompileReduce(`function(keys, values, rereduce) {
		if (rereduce) return sum(values);
		var n = 0;
		for (var i = 0; i < keys.length; i++) n += keys[i][1].length * values[i];
		return n;
	}`, js.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Run([]byte(`[[1,"ab"],[2,"abc"]]`), []byte(`[1,2]`), false)
	if err != nil || string(got) != "8" {
		t.Errorf("reduce: %s %v", got, err)
	}
	if got, err = r.Run(nil, []byte(`[8,4]`), true); err != nil || string(got) != "12" {
		t.Errorf("rereduce: %s %v", got, err)
	}
	thrower, err := js.CompileReduce(`function(k, v, re) { throw "no"; }`, js.Limits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := thrower.Run(nil, []byte(`[1]`), true); !errors.Is(err, js.ErrThrew) {
		t.Errorf("throw: %v", err)
	}
	loop, err := js.CompileReduce(`function(k, v, re) { for (;;) {} }`, js.Limits{Timeout: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Run(nil, []byte(`[1]`), true); !errors.Is(err, js.ErrTimeout) {
		t.Errorf("loop: %v", err)
	}
}

// TestMapMemory: a call that grows the heap past the limit is stopped,
// whatever it allocates, and the function keeps working; a well behaved
// call running beside it is not blamed.
//
// Not parallel: a call stopped for memory beside others runs again alone,
// holding up every other call in the process, the other tests' too.
func TestMapMemory(t *testing.T) {
	limits := js.Limits{MaxMemory: 32 << 20, Timeout: time.Minute}
	for _, tc := range []struct{ name, src string }{
		{"doubled string", `function(doc) { if (doc.hog) { var s = "x"; for (;;) s += s; } emit(1, 2); }`},
		{"growing array", `function(doc) { if (doc.hog) { var a = []; for (;;) a.push({n: a.length, s: "some text"}); } emit(1, 2); }`},
		{"growing object", `function(doc) { if (doc.hog) { var o = {}; for (var i = 0; ; i++) o["k" + i] = [i]; } emit(1, 2); }`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := js.CompileMap(tc.src, limits, nil)
			if err != nil {
				t.Fatal(err)
			}
			// A neighbour: many short calls and a long one, alongside.
			quiet, err := js.CompileMap(`function(doc) { var t = 0; for (var i = 0; i < doc.n; i++) t += i % 7; emit(t, null); }`, limits, nil)
			if err != nil {
				t.Fatal(err)
			}
			stop, ready := make(chan struct{}), make(chan struct{})
			neighbour := make(chan error, 1)
			go func() {
				for n := 0; ; n++ {
					if n == 0 {
						close(ready) // the hog starts beside a running neighbour
					}
					select {
					case <-stop:
						neighbour <- nil
						return
					default:
					}
					size := 100
					if n%50 == 0 {
						size = 500_000
					}
					if _, err := quiet.Run([]byte(fmt.Sprintf(`{"n":%d}`, size))); err != nil {
						neighbour <- err
						return
					}
				}
			}()
			<-ready
			before := js.Reruns()
			_, err = m.Run([]byte(`{"hog":true}`))
			close(stop)
			// The hog never ran alone at first: it ran again alone.
			if js.Reruns() == before {
				t.Error("no call ran again alone")
			}
			if !errors.Is(err, js.ErrTooMuchMemory) {
				t.Errorf("hog: %v", err)
			}
			if err := <-neighbour; err != nil {
				t.Errorf("the neighbour was stopped: %v", err)
			}
			if got, err := m.Run([]byte(`{}`)); err != nil || rows(t, got) != `1=2;` {
				t.Errorf("after the stop: %s %v", rows(t, got), err)
			}
		})
	}
}
