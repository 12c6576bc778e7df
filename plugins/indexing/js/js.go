// Package js runs the JavaScript functions of CouchDB design documents in
// goja, an embedded JavaScript engine written in Go, with the environment
// CouchDB gives them: map functions see emit, log, sum, isArray and
// toJSON.
//
// A function runs under limits: a call that runs longer than the timeout
// is interrupted (ErrTimeout), and one that emits more than the byte
// budget is stopped (ErrTooLarge). goja cannot cap a call's memory
// directly; the timeout bounds what a runaway allocation can do.
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
}

func (l Limits) withDefaults() Limits {
	if l.Timeout <= 0 {
		l.Timeout = 5 * time.Second
	}
	if l.MaxEmitBytes <= 0 {
		l.MaxEmitBytes = 64 << 20
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
	// ErrBadDoc: the input is not a JSON object.
	ErrBadDoc = errors.New("js: the document is not a JSON object")
)

// Row is an emitted key and value, as JSON.
type Row struct {
	Key, Value json.RawMessage
}

// Map is a compiled map function. It is not safe for concurrent use: run
// one Map per goroutine.
type Map struct {
	vm        *goja.Runtime
	fn        goja.Callable
	parse     goja.Callable
	stringify goja.Callable
	limits    Limits
	rows      []Row
	bytes     int
	overflow  bool
}

// CompileMap compiles a map function's source ("function(doc) { ... }").
// Calls of log(message) go to logf.
func CompileMap(src string, l Limits, logf func(msg string)) (*Map, error) {
	m := &Map{vm: goja.New(), limits: l.withDefaults()}
	m.vm.SetFieldNameMapper(goja.TagFieldNameMapper("json", true))
	json := m.vm.Get("JSON").ToObject(m.vm)
	var ok bool
	if m.parse, ok = goja.AssertFunction(json.Get("parse")); !ok {
		return nil, errors.New("js: no JSON.parse")
	}
	if m.stringify, ok = goja.AssertFunction(json.Get("stringify")); !ok {
		return nil, errors.New("js: no JSON.stringify")
	}
	if logf == nil {
		logf = func(string) {}
	}
	env := map[string]any{
		"emit": m.emit,
		"log": func(v goja.Value) {
			if s, ok := v.Export().(string); ok {
				logf(s)
				return
			}
			logf(m.toJSON(v))
		},
		"sum": func(vals []float64) float64 {
			var t float64
			for _, v := range vals {
				t += v
			}
			return t
		},
		"toJSON": func(v goja.Value) string { return m.toJSON(v) },
	}
	for name, fn := range env {
		if err := m.vm.Set(name, fn); err != nil {
			return nil, err
		}
	}
	if _, err := m.vm.RunString(`var isArray = Array.isArray;`); err != nil {
		return nil, err
	}
	v, err := m.run(func() (goja.Value, error) { return m.vm.RunString("(" + src + "\n)") })
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCompile, err)
	}
	if m.fn, ok = goja.AssertFunction(v); !ok {
		return nil, fmt.Errorf("%w: it is a %s", ErrCompile, v.ExportType())
	}
	return m, nil
}

// toJSON is JSON.stringify, with undefined as null.
func (m *Map) toJSON(v goja.Value) string {
	if v == nil || goja.IsUndefined(v) {
		return "null"
	}
	s, err := m.stringify(goja.Undefined(), v)
	if err != nil || goja.IsUndefined(s) {
		return "null"
	}
	return s.String()
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

// run calls f under the timeout.
func (m *Map) run(f func() (goja.Value, error)) (goja.Value, error) {
	t := time.AfterFunc(m.limits.Timeout, func() { m.vm.Interrupt(ErrTimeout) })
	defer t.Stop()
	v, err := f()
	m.vm.ClearInterrupt()
	var ie *goja.InterruptedError
	if errors.As(err, &ie) {
		if cause, ok := ie.Value().(error); ok {
			return nil, cause
		}
		return nil, ErrTimeout
	}
	return v, err
}

// Run calls the map function on one document (a JSON object) and returns
// what it emitted, in order.
func (m *Map) Run(doc []byte) ([]Row, error) {
	m.rows, m.bytes, m.overflow = nil, 0, false
	if len(doc) == 0 || doc[0] != '{' {
		return nil, ErrBadDoc
	}
	_, err := m.run(func() (goja.Value, error) {
		obj, err := m.parse(goja.Undefined(), m.vm.ToValue(string(doc)))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadDoc, err)
		}
		return m.fn(goja.Undefined(), obj)
	})
	switch {
	case err == nil:
		return m.rows, nil
	case errors.Is(err, ErrTimeout), errors.Is(err, ErrTooLarge), errors.Is(err, ErrBadDoc):
		return nil, err
	}
	return nil, fmt.Errorf("%w: %v", ErrThrew, err)
}
