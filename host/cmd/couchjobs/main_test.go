package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/couchjobs/couchjobs/host"
	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/runtime/kv"
	"github.com/couchjobs/couchjobs/runtime/tuple"
)

func TestStoreCommands(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "runtime.toml")
	os.WriteFile(cfgPath, []byte("[node]\nname = \"t1\"\n[store]\npath = \"s.db\"\n"), 0o644)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	s, err := host.OpenStore(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.Transact(ctx, func(tx kv.Tx) (any, error) {
		tx.Set(kv.Sub("couch_jobs", "data").Pack(tuple.Tuple{"shell", "job-1"}), []byte(`{"a":1}`))
		tx.Set(kv.Sub("other").Pack(tuple.Tuple{1}), []byte("x"))
		return nil, nil
	})
	s.Close()

	cases := []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"store", "status", "-config", cfgPath}, []string{"node      t1", "backend   sqlite", "keys      2"}, nil},
		{[]string{"store", "check", "-config", cfgPath}, []string{"ok"}, nil},
		{[]string{"store", "ls", "-config", cfgPath, "couch_jobs"}, []string{`("couch_jobs", "data", "shell", "job-1") = {"a":1}`}, []string{"other"}},
		{[]string{"store", "ls", "-config", cfgPath, "-limit", "1"}, []string{"couch_jobs"}, []string{"other"}},
		{[]string{"store", "ls", "other", "-config", cfgPath, "-limit", "5"}, []string{`("other", 1) = x`}, []string{"couch_jobs"}},
	}
	for _, c := range cases {
		var out bytes.Buffer
		if err := run(ctx, c.args, &out); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", c.args, w, out.String())
			}
		}
		for _, n := range c.not {
			if strings.Contains(out.String(), n) {
				t.Errorf("%v: output has %q:\n%s", c.args, n, out.String())
			}
		}
	}
	for _, bad := range [][]string{{}, {"nope"}, {"store"}, {"store", "nope"}, {"store", "status", "-config", filepath.Join(dir, "missing.toml")}} {
		if err := run(ctx, bad, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestFDBWithoutTag(t *testing.T) {
	cfg, err := config.Parse("x.toml", []byte("[node]\nname = \"n\"\n[store]\nbackend = \"fdb\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.OpenStore(cfg, nil); err == nil || !strings.Contains(err.Error(), "without FoundationDB support") {
		t.Fatalf("err = %v", err)
	}
}
