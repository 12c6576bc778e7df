package shell

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"mvdan.cc/sh/v3/syntax"
)

// ErrNotAllowed: the node's allowlist refuses the command.
var ErrNotAllowed = errors.New("command not allowed on this node")

// result is how one command ended.
type result struct {
	exit     int // -1 when killed or not started
	timedOut bool
	took     time.Duration
	stdout   *tail
	stderr   *tail
	err      error // why it did not run, or how it was killed
}

func (r *result) ok() bool { return r.exit == 0 && r.err == nil }

// command is one command to run.
type command struct {
	text    string
	env     []string
	dir     string
	timeout time.Duration // 0: none
}

// argv returns how the node runs a command: through its shell, or, when
// the node has an allowlist, as a single program without one.
func (c *Config) argv(text string) ([]string, error) {
	if len(c.Allow) == 0 {
		return []string{c.Shell, "-c", text}, nil
	}
	args, err := simpleCommand(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotAllowed, err)
	}
	joined := strings.Join(args, " ")
	if !slices.ContainsFunc(c.Allow, func(p string) bool { return strings.HasPrefix(joined, p) }) {
		return nil, fmt.Errorf("%w: %q matches no prefix of the allowlist", ErrNotAllowed, joined)
	}
	return args, nil
}

// simpleCommand parses text as one program with literal arguments.
func simpleCommand(text string) ([]string, error) {
	f, err := syntax.NewParser(syntax.Variant(syntax.LangPOSIX)).Parse(strings.NewReader(text), "")
	if err != nil {
		return nil, fmt.Errorf("parse %q: %v", text, err)
	}
	if len(f.Stmts) != 1 {
		return nil, fmt.Errorf("%q is not a single command", text)
	}
	st := f.Stmts[0]
	call, ok := st.Cmd.(*syntax.CallExpr)
	if !ok || st.Negated || st.Background || st.Coprocess || len(st.Redirs) > 0 || len(call.Assigns) > 0 || len(call.Args) == 0 {
		return nil, fmt.Errorf("%q is not a plain command (no pipes, lists, redirections or assignments)", text)
	}
	args := make([]string, 0, len(call.Args))
	for _, w := range call.Args {
		s, ok := literal(w)
		if !ok {
			return nil, fmt.Errorf("%q: argument %q is not literal (no variables, substitutions or globs)", text, text[w.Pos().Offset():w.End().Offset()])
		}
		args = append(args, s)
	}
	return args, nil
}

// literal returns a word's value if it holds only literal text, plain or
// quoted.
func literal(w *syntax.Word) (string, bool) {
	var b strings.Builder
	for _, part := range w.Parts {
		switch p := part.(type) {
		case *syntax.Lit:
			if strings.ContainsAny(p.Value, "*?[~") {
				return "", false
			}
			v := p.Value
			// An unquoted backslash escapes the next character.
			var out strings.Builder
			for i := 0; i < len(v); i++ {
				if v[i] == '\\' && i+1 < len(v) {
					i++
				}
				out.WriteByte(v[i])
			}
			b.WriteString(out.String())
		case *syntax.SglQuoted:
			if p.Dollar {
				return "", false
			}
			b.WriteString(p.Value)
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				lit, ok := q.(*syntax.Lit)
				if !ok {
					return "", false
				}
				b.WriteString(strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\$`, `$`, "\\`", "`").Replace(lit.Value))
			}
		default:
			return "", false
		}
	}
	return b.String(), true
}

// run runs a command in a process group of its own and waits for it. The
// group is killed (SIGTERM, then SIGKILL after the grace period) when the
// timeout runs out or ctx is done.
func (c *Config) run(ctx context.Context, cmd command) *result {
	res := &result{exit: -1, stdout: newTail(c.OutputLimit), stderr: newTail(c.OutputLimit)}
	args, err := c.argv(cmd.text)
	if err != nil {
		res.err = err
		return res
	}
	if cmd.dir != "" {
		if fi, err := os.Stat(cmd.dir); err != nil || !fi.IsDir() {
			res.err = fmt.Errorf("working directory %q: not a directory", cmd.dir)
			return res
		}
	}
	p := exec.Command(args[0], args[1:]...)
	p.Env, p.Dir = cmd.env, cmd.dir
	p.Stdout, p.Stderr = res.stdout, res.stderr
	p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	setParentDeath(p.SysProcAttr)
	// A background child that keeps the output pipes open must not hold
	// the step forever once the command itself exited.
	p.WaitDelay = time.Second
	start := time.Now()
	if err := p.Start(); err != nil {
		res.err = fmt.Errorf("start: %w", err)
		return res
	}
	disarm := watchdog(p.Process.Pid)
	defer disarm()
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	var timer <-chan time.Time
	if cmd.timeout > 0 {
		t := time.NewTimer(cmd.timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case err = <-done:
	case <-timer:
		res.timedOut = true
		res.err = fmt.Errorf("timed out after %v; killed its process group", cmd.timeout)
		err = c.kill(p.Process.Pid, done)
	case <-ctx.Done():
		res.err = fmt.Errorf("stopped: %w", context.Cause(ctx))
		err = c.kill(p.Process.Pid, done)
	}
	res.took = time.Since(start)
	if p.ProcessState != nil && res.err == nil {
		res.exit = p.ProcessState.ExitCode()
		if res.exit < 0 {
			res.err = fmt.Errorf("killed: %v", err)
		}
	}
	return res
}

// kill ends a process group: SIGTERM, then SIGKILL after the grace period.
func (c *Config) kill(pgid int, done <-chan error) error {
	syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(c.grace)
	defer t.Stop()
	select {
	case err := <-done:
		syscall.Kill(-pgid, syscall.SIGKILL) // stragglers that ignored SIGTERM
		return err
	case <-t.C:
		syscall.Kill(-pgid, syscall.SIGKILL)
		return <-done
	}
}

// tail keeps the last bytes written to it.
type tail struct {
	mu      sync.Mutex
	limit   int
	buf     []byte
	dropped int64
}

func newTail(limit int) *tail { return &tail{limit: limit} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.limit {
		t.dropped += int64(len(t.buf) + len(p) - t.limit)
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		t.dropped += int64(over)
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept bytes as text: a cut multi-byte character at the
// start is dropped, invalid UTF-8 replaced.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	for i := 0; i < len(b) && i < utf8.UTFMax && t.dropped > 0 && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// Dropped is how many bytes were cut off the front.
func (t *tail) Dropped() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// watchdog makes sure a command's process group does not outlive the
// plugin. Its parent-death signal kills only the command's first process;
// what that started would run on, beside the step's next attempt on
// another node. So a small shell waits on a pipe from the plugin: if the
// plugin dies, the pipe closes before the word "done" arrives, and the
// shell kills the group. The returned func sends "done".
func watchdog(pgid int) (disarm func()) {
	r, w, err := os.Pipe()
	if err != nil {
		return func() {}
	}
	cmd := exec.Command("/bin/sh", "-c", `IFS= read -r word; [ "$word" = done ] || kill -9 -"$1" 2>/dev/null`, "watchdog", strconv.Itoa(pgid))
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return func() {}
	}
	r.Close()
	go cmd.Wait() // reaps it once disarmed
	return func() {
		w.Write([]byte("done\n"))
		w.Close()
	}
}
