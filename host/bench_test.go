package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/host/config"
	"github.com/couchjobs/couchjobs/host/internal/proc"
	"github.com/couchjobs/couchjobs/runtime/jobs"
)

// benchNode runs a node with plugin alpha for a benchmark.
func benchNode(b *testing.B, maxJobs int) *Node {
	b.Helper()
	text := fmt.Sprintf("plugin_dir = %q\n[node]\nname = \"bench\"\n[store]\npath = %q\n[http]\nlisten = \"off\"\n[scheduler]\nmax_jobs = %d\n[plugins.alpha]\n",
		pluginDir, filepath.Join(b.TempDir(), "store.db"), maxJobs)
	cfg, err := config.Parse(filepath.Join(b.TempDir(), "runtime.toml"), []byte(text))
	if err != nil {
		b.Fatal(err)
	}
	n, err := NewNode(cfg, hclog.NewNullLogger(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	if err := n.Ready(ctx); err != nil {
		b.Fatal(err)
	}
	return n
}

// addJobs adds n jobs with the given data, in batches of 1,000.
func addJobs(b *testing.B, n *Node, prefix string, count int, data string) {
	for start := 0; start < count; start += 1000 {
		batch := make([]jobs.NewJob, 0, 1000)
		for i := start; i < min(count, start+1000); i++ {
			batch = append(batch, jobs.NewJob{Type: "alpha", ID: fmt.Sprintf("%s-%07d", prefix, i), Data: json.RawMessage(data)})
		}
		if err := n.Jobs().AddMany(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEndToEnd measures no-op jobs per second through the host and an
// out-of-process plugin: queued in advance, run to completion.
func BenchmarkEndToEnd(b *testing.B) {
	n := benchNode(b, 500)
	addJobs(b, n, "noop", b.N, `{}`)
	b.ResetTimer()
	start := time.Now()
	// Poll cheaply (is any job pending?), so that the measurement does not
	// compete with what it measures.
	for {
		c, err := n.Jobs().PendingCount(context.Background(), "alpha", 0, 1)
		if err != nil {
			b.Fatal(err)
		}
		if c == 0 && n.Plugins()[0].Running == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
}

// BenchmarkDispatchLatency measures one job at a time, from the start of
// its add to its subscriber seeing it finished: the whole round trip
// through store, host and plugin.
func BenchmarkDispatchLatency(b *testing.B) {
	n := benchNode(b, 500)
	lat := make([]time.Duration, 0, b.N)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprint(i)
		start := time.Now()
		if err := n.Jobs().Add(ctx, jobs.NewJob{Type: "alpha", ID: id}); err != nil {
			b.Fatal(err)
		}
		sub, err := n.Jobs().Subscribe(ctx, "alpha", id)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := n.Jobs().Wait(ctx, []*jobs.Subscription{sub}, jobs.Finished); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		sub.Close()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100])/float64(time.Microsecond), "p99-µs")
}

// BenchmarkMemory1000Running reports the host's and the plugin's resident
// memory with 1,000 jobs running at once.
func BenchmarkMemory1000Running(b *testing.B) {
	const running = 1000
	n := benchNode(b, running)
	addJobs(b, n, "sleep", running, `{"sleep_ms":600000}`)
	deadline := time.Now().Add(60 * time.Second)
	for n.Plugins()[0].Running < running {
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d jobs started", n.Plugins()[0].Running, running)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let heartbeats and goroutines settle
	runtime.GC()
	for range b.N {
		b.ReportMetric(proc.RSSMiB(os.Getpid()), "host-MiB")
		b.ReportMetric(proc.RSSMiB(proc.Child(os.Getpid(), "couchjobs-alpha")), "plugin-MiB")
	}
}
