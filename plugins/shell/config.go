package shell

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/couchjobs/couchjobs/sdk"
)

// Config is a node's [plugins.shell.config] table.
type Config struct {
	// Allow, if not empty, restricts the commands this node runs to those
	// starting with one of these prefixes. Such a command must then be one
	// program with arguments (quotes allowed; no pipes, redirections,
	// variables, substitutions or globs); it runs without a shell, so the
	// prefix is all it can do.
	Allow []string `json:"allow"`
	// RunAs, if set, is the user (name or uid) commands run as; the host
	// must then run as root.
	RunAs string `json:"run_as"`
	// Shell runs unrestricted commands, as Shell -c COMMAND; default
	// /bin/sh.
	Shell string `json:"shell"`
	// OutputLimit is how many bytes of the end of stdout and of stderr a
	// step keeps; default 4096, at most 1 MiB.
	OutputLimit int `json:"output_limit"`
	// KillGrace is how long a timed-out or stopped command has between
	// SIGTERM and SIGKILL; default "5s".
	KillGrace string `json:"kill_grace"`

	node   string
	groups []string
	cred   *syscall.Credential
	home   string // RunAs's home directory
	grace  time.Duration
}

const (
	defaultOutputLimit = 4096
	maxOutputLimit     = 1 << 20
)

// configure decodes and checks the table; errors name the key.
func configure(c *sdk.Config) (*Config, error) {
	cfg := &Config{}
	if err := c.Decode(cfg); err != nil {
		return nil, err
	}
	cfg.node, cfg.groups = c.Node, c.Groups
	var errs sdk.ConfigErrors
	for i, p := range cfg.Allow {
		if strings.TrimSpace(p) == "" {
			errs = append(errs, sdk.ConfigError{Key: fmt.Sprintf("allow.%d", i), Message: "an empty prefix would allow every command"})
		}
	}
	if cfg.Shell == "" {
		cfg.Shell = "/bin/sh"
	}
	if _, err := os.Stat(cfg.Shell); err != nil {
		errs = append(errs, sdk.ConfigError{Key: "shell", Message: err.Error()})
	}
	switch {
	case cfg.OutputLimit == 0:
		cfg.OutputLimit = defaultOutputLimit
	case cfg.OutputLimit < 0 || cfg.OutputLimit > maxOutputLimit:
		errs = append(errs, sdk.ConfigError{Key: "output_limit", Message: fmt.Sprintf("%d: want 1 to %d bytes", cfg.OutputLimit, maxOutputLimit)})
	}
	cfg.grace = 5 * time.Second
	if cfg.KillGrace != "" {
		d, err := time.ParseDuration(cfg.KillGrace)
		if err != nil || d < 0 {
			errs = append(errs, sdk.ConfigError{Key: "kill_grace", Message: fmt.Sprintf("%q: want a duration such as \"5s\"", cfg.KillGrace)})
		}
		cfg.grace = d
	}
	if cfg.RunAs != "" {
		if err := cfg.lookupUser(); err != nil {
			errs = append(errs, sdk.ConfigError{Key: "run_as", Message: err.Error()})
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return cfg, nil
}

// lookupUser resolves RunAs to a credential.
func (c *Config) lookupUser() error {
	u, err := user.Lookup(c.RunAs)
	if err != nil {
		if u, err = user.LookupId(c.RunAs); err != nil {
			return fmt.Errorf("user %q: %w", c.RunAs, err)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("user %q: non-numeric uid %q or gid %q", c.RunAs, u.Uid, u.Gid)
	}
	if os.Geteuid() != 0 && uint64(os.Geteuid()) != uid {
		return fmt.Errorf("running commands as %q needs the host to run as root", c.RunAs)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(g))
			}
		}
	}
	c.cred, c.home = cred, u.HomeDir
	return nil
}
