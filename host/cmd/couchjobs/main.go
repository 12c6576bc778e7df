// Command couchjobs is the couchjobs node and its command-line tools.
//
//	couchjobs run           [-config runtime.toml]   run a node until SIGTERM or SIGINT
//	couchjobs jobs add|get|ls|rm|cancel|resubmit|wait ...   a node's jobs, through its API
//	couchjobs plugins ls                              a node's plugins
//	couchjobs passwd                                  hash an admin password
//	couchjobs store status  [-config runtime.toml]   what the store holds
//	couchjobs store check   [-config runtime.toml]   verify the store's files
//	couchjobs store ls      [-config runtime.toml] [-limit N] [ELEMENT...]
//	                        list keys under a tuple prefix, decoded
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/host"
	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/kv/sqlitekv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

const usage = `usage: couchjobs COMMAND [ARGS]

Commands:
  run            run a node: its plugins and their jobs, until SIGTERM or SIGINT
  jobs add TYPE ID [-data JSON] [-at WHEN] [-priority N] [-placement P] [-group G]
  jobs get TYPE ID
  jobs ls TYPE [-state S] [-limit N] [-after ID]
  jobs rm|cancel TYPE ID
  jobs resubmit TYPE ID [-at WHEN] [-data JSON]
  jobs wait TYPE ID [-state S] [-timeout D]   follow a job, showing its progress
  plugins ls     the node's plugins and their health
  shares ls      share groups: shares, usage, running and pending jobs, fair target
  shares set GROUP N | shares reset GROUP   a group's shares (1 to 1000; default 100), cluster-wide
  passwd         print the bcrypt hash of a password read from stdin, for [http].admins
  store status   show the store a runtime.toml names: backend, keys, commits, size
  store check    verify the store's files (the embedded store's integrity check)
  store ls       list keys under a tuple prefix, decoded as tuples

API commands take -node URL (default: http.listen of -config runtime.toml),
-user and -password (or COUCHJOBS_USER and COUCHJOBS_PASSWORD) for changes,
and -json. Run "couchjobs COMMAND -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "couchjobs:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 1 {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "run":
		return runNode(ctx, args[1:])
	case "jobs":
		return jobsCommand(ctx, args[1:], out)
	case "plugins":
		return pluginsCommand(ctx, args[1:], out)
	case "shares":
		return sharesCommand(ctx, args[1:], out)
	case "passwd":
		return passwdCommand(args[1:], os.Stdin, out)
	case "store":
		if len(args) < 2 {
			return errors.New("store: want status, check or ls")
		}
		switch args[1] {
		case "status":
			return storeStatus(ctx, args[2:], out)
		case "check":
			return storeCheck(ctx, args[2:], out)
		case "ls":
			return storeList(ctx, args[2:], out)
		}
		return fmt.Errorf("store: unknown command %q (want status, check or ls)", args[1])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(out, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// runNode runs a node until ctx is done (SIGTERM or SIGINT).
func runNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := fs.String("config", "runtime.toml", "the node's configuration file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	n, err := host.NewNode(cfg, newLogger(cfg), host.Options{})
	if err != nil {
		return err
	}
	return n.Run(ctx)
}

func newLogger(cfg *config.Config) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "couchjobs", Level: hclog.LevelFromString(cfg.Log.Level), JSONFormat: cfg.Log.JSON})
}

// openStore parses the common -config flag, and any other flags wherever
// they stand among the arguments, and opens the store. fs.Args() are then
// the positional arguments.
func openStore(fs *flag.FlagSet, args []string) (*config.Config, kv.Store, error) {
	path := fs.String("config", "runtime.toml", "the node's configuration file")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	fs.Parse(append([]string{"--"}, pos...))
	cfg, err := config.Load(*path)
	if err != nil {
		return nil, nil, err
	}
	s, err := host.OpenStore(cfg, newLogger(cfg))
	if err != nil {
		return nil, nil, err
	}
	return cfg, s, nil
}

func storeStatus(ctx context.Context, args []string, out io.Writer) error {
	cfg, s, err := openStore(flag.NewFlagSet("store status", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(out, "node      %s\n", cfg.Node.Name)
	fmt.Fprintf(out, "backend   %s\n", cfg.Store.Backend)
	if st, ok := s.(*sqlitekv.Store); ok {
		stats, err := st.Stats(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "file      %s\n", st.Path())
		fmt.Fprintf(out, "keys      %d\n", stats.Keys)
		fmt.Fprintf(out, "commits   %d\n", stats.Version)
		fmt.Fprintf(out, "size      %d bytes (+ %d in the write-ahead log)\n", stats.FileBytes, stats.WALBytes)
		return nil
	}
	fmt.Fprintf(out, "cluster   %s\n", cfg.Store.ClusterFile)
	return nil
}

func storeCheck(ctx context.Context, args []string, out io.Writer) error {
	_, s, err := openStore(flag.NewFlagSet("store check", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	defer s.Close()
	c, ok := s.(interface{ IntegrityCheck(context.Context) error })
	if !ok {
		return errors.New("store check: this backend checks itself; see its own tools (fdbcli status)")
	}
	if err := c.IntegrityCheck(ctx); err != nil {
		return err
	}
	fmt.Fprintln(out, "ok")
	return nil
}

func storeList(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("store ls", flag.ContinueOnError)
	limit := fs.Int("limit", 100, "list at most this many keys")
	_, s, err := openStore(fs, args)
	if err != nil {
		return err
	}
	defer s.Close()
	// Elements that parse as integers are integers, as in the key layout.
	prefix := tuple.Tuple{}
	for _, a := range fs.Args() {
		if n, err := strconv.ParseInt(a, 10, 64); err == nil {
			prefix = append(prefix, n)
		} else {
			prefix = append(prefix, a)
		}
	}
	r := kv.Range{Begin: []byte{}, End: []byte{0xff}}
	if len(prefix) > 0 {
		r = kv.Sub(prefix...).Range()
	}
	v, err := s.ReadTransact(ctx, func(tx kv.ReadTx) (any, error) {
		return tx.GetRange(r, kv.RangeOptions{Limit: *limit})
	})
	if err != nil {
		return err
	}
	for _, p := range v.([]kv.KeyValue) {
		k := tuple.Printable(p.Key)
		if t, err := tuple.Unpack(p.Key); err == nil {
			k = t.String()
		}
		val := tuple.Printable(p.Value)
		if len(val) > 60 {
			val = val[:60] + "…"
		}
		fmt.Fprintf(out, "%s = %s\n", k, val)
	}
	return nil
}
