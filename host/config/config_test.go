package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, text, wantErr string
	}{
		{"minimal", "[node]\nname = \"n1\"\n[store]\npath = \"x.db\"\n", ""},
		{"fdb", "[node]\nname = \"n1\"\n[store]\nbackend = \"fdb\"\ncluster_file = \"/etc/fdb.cluster\"\n", ""},
		{"unknown key", "[node]\nname = \"n1\"\nnmae = \"x\"\n[store]\npath = \"x.db\"\n", "cfg.toml: unknown key node.nmae"},
		{"unknown table", "[nodes]\nname = \"n1\"\n", "unknown key nodes"},
		{"wrong type", "[node]\nname = 5\n", `cfg.toml: line 2 (last key "node.name"): incompatible types`},
		{"syntax", "[node\n", "cfg.toml:2: expected"},
		{"bad backend", "[node]\nname = \"n1\"\n[store]\nbackend = \"redis\"\n", `store.backend "redis"`},
		{"no path", "[node]\nname = \"n1\"\n[store]\nbackend = \"sqlite\"\n", "store.path"},
		{"bad durability", "[node]\nname = \"n1\"\n[store]\npath = \"x\"\ndurability = \"maybe\"\n", `store.durability "maybe"`},
		{"bad name", "[node]\nname = \"a b\"\n[store]\npath = \"x\"\n", `node.name "a b"`},
		{"shares out of range", "[store]\npath = \"x\"\n[scheduler.shares]\ng = 5000\n", "scheduler.shares.g: 5000 is outside 1..1000"},
		{"usage_coeff of 1", "[store]\npath = \"x\"\n[scheduler]\nusage_coeff = 1.0\n", "scheduler.usage_coeff: 1 is outside [0, 1)"},
		{"type cap of 0", "[store]\npath = \"x\"\n[plugins.p]\ntype_max_jobs = { t = 0 }\n", "plugins.p.type_max_jobs.t: 0: want at least 1"},
		{"max_churn below -1", "[store]\npath = \"x\"\n[scheduler]\nmax_churn = -2\n", "scheduler.max_churn: -2"},
		{"tiny interval", "[store]\npath = \"x\"\n[scheduler]\ninterval = \"1ms\"\n", "scheduler.interval: 1ms is under 10ms"},
		{"bad group", "[node]\nname = \"n\"\ngroups = [\"ok\", \"-no\"]\n[store]\npath = \"x\"\n", `node.groups: "-no"`},
		{"bad level", "[node]\nname = \"n\"\n[store]\npath = \"x\"\n[log]\nlevel = \"loud\"\n", `log.level "loud"`},
		{"plugins", "[node]\nname = \"n\"\n[store]\npath = \"x\"\n[plugins.shell]\nmax_jobs = 4\n[plugins.shell.config]\nanything = [1, \"goes\"]\n", ""},
		{"bad plugin key", "[node]\nname = \"n\"\n[store]\npath = \"x\"\n[plugins.shell]\nmaxjobs = 4\n", "unknown key plugins.shell.maxjobs"},
		{"bad sha", "[node]\nname = \"n\"\n[store]\npath = \"x\"\n[plugins.shell]\nsha256 = \"abc\"\n", "plugins.shell.sha256"},
		{"bad duration", "[node]\nname = \"n\"\n[store]\npath = \"x\"\n[scheduler]\nmin_backoff = \"soon\"\n", `duration "soon"`},
		{"backoff order", "[node]\nname = \"n\"\n[store]\npath = \"x\"\n[scheduler]\nmin_backoff = \"1h\"\nmax_backoff = \"1m\"\n", "scheduler.max_backoff"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := Parse("cfg.toml", []byte(c.text))
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.Log.Level != "info" {
					t.Errorf("default log level = %q", cfg.Log.Level)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("/etc/couchjobs/runtime.toml", []byte("[node]\nname = \"n\"\n[store]\npath = \"data/jobs.db\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Resolve(cfg.Store.Path); got != "/etc/couchjobs/data/jobs.db" {
		t.Errorf("Resolve = %s", got)
	}
	if got := cfg.Resolve("/abs"); got != "/abs" {
		t.Errorf("Resolve(/abs) = %s", got)
	}
}

// The sample at the repository root must always load.
func TestSampleConfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "runtime.toml")
	if _, err := os.Stat(path); err != nil {
		t.Fatal("the sample runtime.toml at the repository root is missing")
	}
	if _, err := Load(path); err != nil {
		t.Fatal(err)
	}
}

// FuzzParse feeds arbitrary text to the decoder: it must return a
// configuration or an error naming the file, never panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte("[node]\nname = \"n1\"\n[store]\npath = \"x.db\"\n"))
	f.Add([]byte("[store]\nbackend = \"fdb\"\napi_version = 730\n"))
	f.Add([]byte("[log]\nlevel = 3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.toml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.toml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if cfg.Store.Backend == "" || cfg.Node.Name == "" {
			t.Fatalf("accepted config without defaults: %+v", cfg)
		}
	})
}

// A plugin's config table may hold arrays of tables; they reach the
// plugin whole, and typos outside it are still errors.
func TestPluginConfigArrays(t *testing.T) {
	t.Parallel()
	text := "[store]\npath = \"x\"\n[plugins.p]\n[plugins.p.config]\nq = 1\n[[plugins.p.config.servers]]\nname = \"a\"\nurl = \"http://h\"\n[[plugins.p.config.servers]]\nname = \"b\"\n"
	c, err := Parse("runtime.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	servers, _ := c.Plugins["p"].Config["servers"].([]map[string]any)
	if len(servers) != 2 || servers[0]["url"] != "http://h" || servers[1]["name"] != "b" {
		t.Fatalf("servers %#v", c.Plugins["p"].Config["servers"])
	}
	if _, err := Parse("runtime.toml", []byte(text+"[plugins.p.extra]\nx = 1\n")); err == nil || !strings.Contains(err.Error(), "unknown key plugins.p.extra") {
		t.Fatalf("a typo beside config: %v", err)
	}
}
