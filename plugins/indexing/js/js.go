// Package js runs the JavaScript functions of CouchDB design documents in
// goja, an embedded JavaScript engine written in Go, with the environment
// CouchDB gives them: map functions see emit, log, sum, isArray and
// toJSON.
//
// A function runs under limits: a call that runs longer than the timeout
// is interrupted (ErrTimeout), one that emits more than the byte budget is
// stopped (ErrTooLarge), and one that grows the heap past the memory limit
// is stopped (ErrTooMuchMemory). goja cannot count a call's memory, so the
// process's heap is watched while calls run (see limit.go).
package js

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dop251/goja"
)

// Limits bound one call of a function.
type Limits struct {
	// Timeout interrupts a call; default 5 s (CouchDB's
	// os_process_timeout).
	Timeout time.Duration
	// MaxEmitBytes bounds the keys and values one map call emits;
	// default 64 MiB.
	MaxEmitBytes int
	// MaxMemory bounds how much one call may grow the heap; default
	// 256 MiB. A call is stopped within about 10 ms of passing it, so
	// one that allocates very fast (a string doubled in a loop) may
	// briefly hold a few times the limit.
	MaxMemory int64
}

func (l Limits) withDefaults() Limits {
	if l.Timeout <= 0 {
		l.Timeout = 5 * time.Second
	}
	if l.MaxEmitBytes <= 0 {
		l.MaxEmitBytes = 64 << 20
	}
	if l.MaxMemory <= 0 {
		l.MaxMemory = 256 << 20
	}
	return l
}

// Errors a call can end with; match with errors.Is.
var (
	// ErrCompile: the source is not a function.
	ErrCompile = errors.New("js: does not compile to a function")
	// ErrThrew: the function threw on this input. CouchDB skips the
	// document and logs it.
	ErrThrew = errors.New("js: the function threw")
	// ErrTimeout: the call ran past Limits.Timeout.
	ErrTimeout = errors.New("js: the function ran too long")
	// ErrTooLarge: the call emitted more than Limits.MaxEmitBytes.
	ErrTooLarge = errors.New("js: the function emitted too much")
	// ErrTooMuchMemory: the call grew the heap past Limits.MaxMemory.
	ErrTooMuchMemory = errors.New("js: the function used too much memory")
	// ErrBadDoc: the input is not a JSON object.
	ErrBadDoc = errors.New("js: the document is not a JSON object")
)

// Row is an emitted key and value, as JSON.
type Row struct {
	Key, Value json.RawMessage
}

// engine is one goja runtime with CouchDB's environment and the limits.
type engine struct {
	vm        *goja.Runtime
	parse     goja.Callable
	stringify goja.Callable
	limits    Limits
}

func newEngine(l Limits, logf func(msg string), emit func(key, value goja.Value)) (*engine, error) {
	e := &engine{vm: goja.New(), limits: l.withDefaults()}
	e.vm.SetFieldNameMapper(goja.TagFieldNameMapper("json", true))
	json := e.vm.Get("JSON").ToObject(e.vm)
	var ok bool
	if e.parse, ok = goja.AssertFunction(json.Get("parse")); !ok {
		return nil, errors.New("js: no JSON.parse")
	}
	if e.stringify, ok = goja.AssertFunction(json.Get("stringify")); !ok {
		return nil, errors.New("js: no JSON.stringify")
	}
	if logf == nil {
		logf = func(string) {}
	}
	env := map[string]any{
		"log": func(v goja.Value) {
			if s, ok := v.Export().(string); ok {
				logf(s)
				return
			}
			logf(e.toJSON(v))
		},
		"sum": func(vals []float64) float64 {
			var t float64
			for _, v := range vals {
				t += v
			}
			return t
		},
		"toJSON": func(v goja.Value) string { return e.toJSON(v) },
	}
	if emit != nil {
		env["emit"] = emit
	}
	for name, fn := range env {
		if err := e.vm.Set(name, fn); err != nil {
			return nil, err
		}
	}
	if _, err := e.vm.RunString(`var isArray = Array.isArray;`); err != nil {
		return nil, err
	}
	return e, nil
}

// compile evaluates a function's source.
func (e *engine) compile(src string) (goja.Callable, error) {
	v, err := e.run(func() (goja.Value, error) { return e.vm.RunString("(" + src + "\n)") })
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCompile, err)
	}
	fn, ok := goja.AssertFunction(v)
	if !ok {
		return nil, fmt.Errorf("%w: it is a %s", ErrCompile, v.ExportType())
	}
	return fn, nil
}

// toJSON is JSON.stringify, with undefined as null.
func (e *engine) toJSON(v goja.Value) string {
	if v == nil || goja.IsUndefined(v) {
		return "null"
	}
	s, err := e.stringify(goja.Undefined(), v)
	if err != nil || goja.IsUndefined(s) {
		return "null"
	}
	return s.String()
}

// fromJSON parses a JSON text into a JavaScript value.
func (e *engine) fromJSON(raw []byte) (goja.Value, error) {
	return e.parse(goja.Undefined(), e.vm.ToValue(string(raw)))
}

// Map is a compiled map function. It is not safe for concurrent use: run
// one Map per goroutine.
type Map struct {
	*engine
	fn       goja.Callable
	rows     []Row
	bytes    int
	overflow bool
}

// CompileMap compiles a map function's source ("function(doc) { ... }").
// Calls of log(message) go to logf.
func CompileMap(src string, l Limits, logf func(msg string)) (*Map, error) {
	m := &Map{}
	e, err := newEngine(l, logf, m.emit)
	if err != nil {
		return nil, err
	}
	m.engine = e
	if m.fn, err = e.compile(src); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Map) emit(key, value goja.Value) {
	if m.overflow {
		return
	}
	k, v := m.toJSON(key), m.toJSON(value)
	m.bytes += len(k) + len(v)
	if m.bytes > m.limits.MaxEmitBytes {
		m.overflow = true
		m.vm.Interrupt(ErrTooLarge)
		return
	}
	m.rows = append(m.rows, Row{Key: json.RawMessage(k), Value: json.RawMessage(v)})
}

// Run calls the map function on one document (a JSON object) and returns
// what it emitted, in order.
func (m *Map) Run(doc []byte) ([]Row, error) {
	if len(doc) == 0 || doc[0] != '{' {
		return nil, ErrBadDoc
	}
	_, err := m.run(func() (goja.Value, error) {
		m.rows, m.bytes, m.overflow = nil, 0, false
		obj, err := m.fromJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadDoc, err)
		}
		return m.fn(goja.Undefined(), obj)
	})
	switch {
	case err == nil:
		return m.rows, nil
	case errors.Is(err, ErrTimeout), errors.Is(err, ErrTooLarge), errors.Is(err, ErrTooMuchMemory), errors.Is(err, ErrBadDoc):
		return nil, err
	}
	return nil, fmt.Errorf("%w: %v", ErrThrew, err)
}

// Reduce is a compiled JavaScript reduce function,
// function(keys, values, rereduce). Like Map it is not safe for
// concurrent use.
type Reduce struct {
	*engine
	fn goja.Callable
}

// CompileReduce compiles a reduce function's source.
func CompileReduce(src string, l Limits, logf func(msg string)) (*Reduce, error) {
	e, err := newEngine(l, logf, nil)
	if err != nil {
		return nil, err
	}
	r := &Reduce{engine: e}
	if r.fn, err = e.compile(src); err != nil {
		return nil, err
	}
	return r, nil
}

// Run calls the function. keys is a JSON array of [key, docid] pairs, or
// nil for a rereduce (then values are earlier results); values is a JSON
// array. It returns the result as JSON.
func (r *Reduce) Run(keys, values []byte, rereduce bool) (json.RawMessage, error) {
	out, err := r.run(func() (goja.Value, error) {
		k := goja.Null()
		if keys != nil {
			v, err := r.fromJSON(keys)
			if err != nil {
				return nil, err
			}
			k = v
		}
		vs, err := r.fromJSON(values)
		if err != nil {
			return nil, err
		}
		return r.fn(goja.Undefined(), k, vs, r.vm.ToValue(rereduce))
	})
	switch {
	case err == nil:
		return json.RawMessage(r.toJSON(out)), nil
	case errors.Is(err, ErrTimeout), errors.Is(err, ErrTooMuchMemory):
		return nil, err
	}
	return nil, fmt.Errorf("%w: %v", ErrThrew, err)
}
