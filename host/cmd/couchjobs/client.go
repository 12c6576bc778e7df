package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/couchjobs/couchjobs/host"
	"github.com/couchjobs/couchjobs/host/config"
)

// client talks to a node's HTTP API.
type client struct {
	base       string
	user, pass string
	json       bool
	out        io.Writer
	http       *http.Client
}

// clientFlags are the flags every API command takes.
func clientFlags(fs *flag.FlagSet) func(io.Writer) (*client, error) {
	node := fs.String("node", "", "the node's API URL (default: http.listen of -config, else http://"+config.DefaultListen+")")
	cfgPath := fs.String("config", "runtime.toml", "a configuration file to find the API in, if -node is not given")
	user := fs.String("user", os.Getenv("COUCHJOBS_USER"), "admin name for changes (or COUCHJOBS_USER)")
	pass := fs.String("password", os.Getenv("COUCHJOBS_PASSWORD"), "admin password for changes (or COUCHJOBS_PASSWORD)")
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	return func(out io.Writer) (*client, error) {
		base := *node
		if base == "" {
			base = "http://" + config.DefaultListen
			if cfg, err := config.Load(*cfgPath); err == nil && cfg.HTTP.Listen != "off" {
				base = "http://" + cfg.HTTP.Listen
			}
		}
		if _, err := url.Parse(base); err != nil {
			return nil, fmt.Errorf("-node %q: %w", base, err)
		}
		return &client{base: strings.TrimRight(base, "/"), user: *user, pass: *pass, json: *asJSON, out: out, http: &http.Client{}}, nil
	}
}

// call sends a request and decodes a JSON answer into v; an error answer
// becomes an error with the node's reason.
func (c *client) call(ctx context.Context, method, path string, body, v any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("is the node running? %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e struct{ Error, Reason string }
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusUnauthorized && c.user == "" {
				return fmt.Errorf("%s: %s (give -user and -password, or set COUCHJOBS_USER and COUCHJOBS_PASSWORD)", e.Error, e.Reason)
			}
			return fmt.Errorf("%s: %s", e.Error, e.Reason)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if v != nil {
		return json.Unmarshal(b, v)
	}
	return nil
}

// printJSON prints v indented.
func (c *client) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseArgs parses flags placed before, between or after the positional
// arguments, and checks their count.
func parseArgs(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != len(names) {
		return nil, fmt.Errorf("%s: want %s, got %d argument(s)", fs.Name(), strings.Join(names, " "), len(pos))
	}
	return pos, nil
}

func jobsCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 {
		return errors.New("jobs: want add, get, ls, rm, cancel, resubmit or wait")
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("jobs "+cmd, flag.ContinueOnError)
	connect := clientFlags(fs)
	switch cmd {
	case "add":
		data := fs.String("data", "", "the job's data, a JSON object")
		prio := fs.Int64("priority", 0, "priority: lower runs first")
		at := fs.String("at", "", "run at this time (RFC 3339, or a delay such as 10m)")
		placement := fs.String("placement", "", `where it runs: "*", "node:NAME" or "group:NAME"`)
		group := fs.String("group", "", "share group (default: the type)")
		exclusive := fs.Bool("exclusive", false, "fail if the job exists")
		pos, err := parseArgs(fs, args, "TYPE", "ID")
		if err != nil {
			return err
		}
		c, err := connect(out)
		if err != nil {
			return err
		}
		req := host.AddRequest{ID: pos[1], Priority: *prio, Placement: *placement, Group: *group, Exclusive: *exclusive}
		if *data != "" {
			req.Data = json.RawMessage(*data)
			if !json.Valid(req.Data) {
				return fmt.Errorf("-data is not valid JSON: %s", *data)
			}
		}
		if *at != "" {
			t, err := parseWhen(*at)
			if err != nil {
				return err
			}
			req.At = &t
		}
		if err := c.call(ctx, "POST", "/jobs/"+url.PathEscape(pos[0]), req, nil); err != nil {
			return err
		}
		fmt.Fprintf(out, "added %s/%s\n", pos[0], pos[1])
		return nil
	case "get":
		pos, c, err := setup(fs, connect, args, out, "TYPE", "ID")
		if err != nil {
			return err
		}
		var j host.JobJSON
		if err := c.call(ctx, "GET", jobPath(pos), nil, &j); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(j)
		}
		printJob(out, j)
		return nil
	case "ls":
		state := fs.String("state", "", "only jobs in this state: pending, running or finished")
		limit := fs.Int("limit", 100, "the most jobs to list")
		after := fs.String("after", "", "list jobs whose ids sort after this one")
		pos, c, err := setup(fs, connect, args, out, "TYPE")
		if err != nil {
			return err
		}
		q := url.Values{"limit": {fmt.Sprint(*limit)}}
		if *state != "" {
			q.Set("state", *state)
		}
		if *after != "" {
			q.Set("after", *after)
		}
		var page struct {
			Jobs []host.JobJSON `json:"jobs"`
			Next string         `json:"next"`
		}
		if err := c.call(ctx, "GET", "/jobs/"+url.PathEscape(pos[0])+"?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(page)
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tPRIORITY\tUPDATED\tPROGRESS")
		for _, j := range page.Jobs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", j.ID, state4(j), j.Priority, when(j.Updated), progress(j))
		}
		tw.Flush()
		if page.Next != "" {
			fmt.Fprintf(out, "more: -after %s\n", page.Next)
		}
		return nil
	case "rm", "cancel", "resubmit":
		at := fs.String("at", "", "resubmit: run at this time (RFC 3339, or a delay such as 10m)")
		data := fs.String("data", "", "resubmit: new data, a JSON object")
		pos, c, err := setup(fs, connect, args, out, "TYPE", "ID")
		if err != nil {
			return err
		}
		switch cmd {
		case "rm":
			err = c.call(ctx, "DELETE", jobPath(pos), nil, nil)
		case "cancel":
			err = c.call(ctx, "POST", jobPath(pos)+"/_cancel", nil, nil)
		default:
			req := host.ResubmitRequest{}
			if *data != "" {
				req.Data = json.RawMessage(*data)
			}
			if *at != "" {
				t, perr := parseWhen(*at)
				if perr != nil {
					return perr
				}
				req.At = &t
			}
			err = c.call(ctx, "POST", jobPath(pos)+"/_resubmit", req, nil)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s %s/%s: ok\n", cmd, pos[0], pos[1])
		return nil
	case "wait":
		state := fs.String("state", "finished", "wait for this state: pending, running or finished")
		timeout := fs.Duration("timeout", 0, "give up after this long (0: never)")
		pos, c, err := setup(fs, connect, args, out, "TYPE", "ID")
		if err != nil {
			return err
		}
		if *timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, *timeout)
			defer cancel()
		}
		return c.wait(ctx, pos, *state)
	}
	return fmt.Errorf("jobs: unknown command %q (want add, get, ls, rm, cancel, resubmit or wait)", cmd)
}

// wait follows a job with long-polls, printing each change, until it
// reaches state.
func (c *client) wait(ctx context.Context, pos []string, state string) error {
	since := ""
	for {
		q := url.Values{"timeout": {"60s"}}
		if since != "" {
			q.Set("since", since)
		}
		var r struct {
			Job     host.JobJSON `json:"job"`
			Version string       `json:"version"`
			Timeout bool         `json:"timeout"`
		}
		if err := c.call(ctx, "GET", jobPath(pos)+"/_wait?"+q.Encode(), nil, &r); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("gave up waiting: %w", ctx.Err())
			}
			return err
		}
		if !r.Timeout || since == "" {
			if c.json {
				c.printJSON(r.Job)
			} else {
				fmt.Fprintf(c.out, "%s  %-9s %s\n", time.Now().Format("15:04:05"), state4(r.Job), progress(r.Job))
			}
		}
		since = r.Version
		if string(r.Job.State) == state || r.Job.State == "finished" {
			if string(r.Job.State) != state {
				return fmt.Errorf("job %s/%s finished before it was %s", pos[0], pos[1], state)
			}
			if meta := jobMeta(r.Job); meta["outcome"] == "failed" {
				return fmt.Errorf("job %s/%s failed: %v", pos[0], pos[1], meta["reason"])
			}
			return nil
		}
	}
}

func setup(fs *flag.FlagSet, connect func(io.Writer) (*client, error), args []string, out io.Writer, names ...string) ([]string, *client, error) {
	pos, err := parseArgs(fs, args, names...)
	if err != nil {
		return nil, nil, err
	}
	c, err := connect(out)
	return pos, c, err
}

func jobPath(pos []string) string {
	return "/jobs/" + url.PathEscape(pos[0]) + "/" + url.PathEscape(pos[1])
}

// parseWhen reads an RFC 3339 time or a delay from now.
func parseWhen(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a delay (10m)", s)
	}
	return t, nil
}

func jobMeta(j host.JobJSON) map[string]any {
	var d struct {
		Meta map[string]any `json:"_couchjobs"`
	}
	json.Unmarshal(j.Data, &d)
	return d.Meta
}

// state4 is a job's state, with its last outcome when it has one.
func state4(j host.JobJSON) string {
	s := string(j.State)
	if j.Canceled {
		return s + " (canceled)"
	}
	if o, _ := jobMeta(j)["outcome"].(string); o != "" && o != "completed" {
		s += " (" + o + ")"
	}
	return s
}

func progress(j host.JobJSON) string {
	m := jobMeta(j)
	var parts []string
	if f, ok := m["progress"].(float64); ok {
		parts = append(parts, fmt.Sprintf("%3.0f%%", 100*f))
	}
	if msg, _ := m["message"].(string); msg != "" {
		parts = append(parts, msg)
	}
	if r, _ := m["reason"].(string); r != "" && m["outcome"] != "completed" {
		parts = append(parts, strings.SplitN(r, "\n", 2)[0])
	}
	return strings.Join(parts, " ")
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func printJob(out io.Writer, j host.JobJSON) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "type\t%s\nid\t%s\nstate\t%s\npriority\t%d\n", j.Type, j.ID, state4(j), j.Priority)
	if j.Placement != "" && j.Placement != "*" {
		fmt.Fprintf(tw, "placement\t%s\n", j.Placement)
	}
	fmt.Fprintf(tw, "group\t%s\ncreated\t%s\nupdated\t%s\n", j.Group, when(j.Created), when(j.Updated))
	if p := progress(j); p != "" {
		fmt.Fprintf(tw, "progress\t%s\n", p)
	}
	fmt.Fprintf(tw, "data\t%s\n", j.Data)
	tw.Flush()
}

func pluginsCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 || args[0] != "ls" {
		return errors.New("plugins: want ls")
	}
	fs := flag.NewFlagSet("plugins ls", flag.ContinueOnError)
	connect := clientFlags(fs)
	_, c, err := setup(fs, connect, args[1:], out)
	if err != nil {
		return err
	}
	var r struct {
		Plugins []host.PluginStatus `json:"plugins"`
	}
	if err := c.call(ctx, "GET", "/plugins", nil, &r); err != nil {
		return err
	}
	if c.json {
		return c.printJSON(r)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tVERSION\tTYPES\tRUNNING\tRESTARTS\tERROR")
	for _, p := range r.Plugins {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", p.Name, p.State, p.Version, strings.Join(p.Types, ","), p.Running, p.Restarts, p.Error)
	}
	return tw.Flush()
}

// passwdCommand prints the bcrypt hash of a password read from stdin, for
// [http].admins.
func passwdCommand(args []string, in io.Reader, out io.Writer) error {
	if len(args) > 0 {
		return errors.New("passwd: reads the password from standard input; takes no arguments")
	}
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	pass := strings.TrimRight(line, "\r\n")
	if pass == "" {
		return errors.New("passwd: the password is empty")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, string(h))
	return nil
}

// sharesCommand shows and sets share groups' shares, cluster-wide.
func sharesCommand(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 {
		return errors.New("shares: want ls, set or reset")
	}
	fs := flag.NewFlagSet("shares "+args[0], flag.ContinueOnError)
	connect := clientFlags(fs)
	switch args[0] {
	case "ls":
		_, c, err := setup(fs, connect, args[1:], out)
		if err != nil {
			return err
		}
		var r struct {
			Groups []host.GroupJSON `json:"groups"`
		}
		if err := c.call(ctx, "GET", "/shares", nil, &r); err != nil {
			return err
		}
		if c.json {
			return c.printJSON(r)
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GROUP\tSHARES\tUSAGE\tRUNNING\tPENDING\tTARGET\tEFFECTIVE")
		for _, g := range r.Groups {
			fmt.Fprintf(tw, "%s\t%d\t%.1fs\t%d\t%d\t%.1f\t%.1f%%\n", g.Name, g.Shares, g.Usage, g.Running, g.Pending, g.Target, 100*g.EffectiveShare)
		}
		return tw.Flush()
	case "set":
		pos, c, err := setup(fs, connect, args[1:], out, "GROUP", "SHARES")
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(pos[1])
		if err != nil {
			return fmt.Errorf("shares set: %q is not a number of shares (1 to 1000)", pos[1])
		}
		var r struct{ Shares int }
		if err := c.call(ctx, "PUT", "/shares/"+url.PathEscape(pos[0]), map[string]int{"shares": n}, &r); err != nil {
			return err
		}
		fmt.Fprintf(out, "group %s: %d shares\n", pos[0], r.Shares)
		return nil
	case "reset":
		pos, c, err := setup(fs, connect, args[1:], out, "GROUP")
		if err != nil {
			return err
		}
		if err := c.call(ctx, "DELETE", "/shares/"+url.PathEscape(pos[0]), nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(out, "group %s: default shares (%d)\n", pos[0], 100)
		return nil
	}
	return fmt.Errorf("shares: unknown command %q (want ls, set or reset)", args[0])
}
