// Command benchfair measures the fair-share scheduler across host
// processes (make bench-fairness): two couchjobs nodes sharing one
// embedded store, running continuous no-op jobs of the host's test plugin.
//
//   - Fairness under saturation: groups with 200, 100 and 50 shares, each
//     with more jobs than the cluster has slots; each group's share of the
//     running jobs, sampled over windows, against its target; the weighted
//     Jain index (share divided by weight).
//   - Noisy neighbour: group A floods 10,000 jobs, then group B adds 10;
//     how long B's jobs wait to start, in scheduling intervals.
//
// The scheduler's cost per decision is measured by the Go benchmarks
// (BenchmarkAcceptRanked in runtime/jobs, make bench).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/runtime/sched"
)

const typ = "continuous"

func main() {
	window := flag.Duration("window", 20*time.Second, "length of a measurement window")
	windows := flag.Int("windows", 6, "measurement windows")
	slots := flag.Int("slots", 10, "job slots per node (2 nodes)")
	interval := flag.Duration("interval", time.Second, "scheduler.interval")
	flood := flag.Int("flood", 10_000, "jobs group A floods in the noisy-neighbour run")
	verbose := flag.Bool("v", false, "show the nodes' logs")
	flag.Parse()
	if err := run(*window, *windows, *slots, *interval, *flood, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "benchfair:", err)
		os.Exit(1)
	}
}

func run(window time.Duration, windows, slots int, interval time.Duration, flood int, verbose bool) error {
	ctx := context.Background()
	work, bin, err := cluster.Workspace(ctx, "fairness", cluster.Plugin{Name: typ, Package: "github.com/couchjobs/couchjobs/host/testdata/testplugin"})
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var logs io.Writer
	if verbose {
		logs = os.Stderr
	}
	opts := cluster.Options{Bin: bin, Plugin: typ, Workers: slots, ActivityTimeout: 10 * time.Second, Log: logs,
		Scheduler: fmt.Sprintf("max_jobs = %d\ninterval = %q\nmin_run_time = %q\nmax_churn = 20", slots, interval, 2*interval)}
	fmt.Printf("2 nodes × %d slots, interval %v, min_run_time %v, max_churn 20.\n\n", slots, interval, 2*interval)
	if windows > 0 {
		if err := fairness(ctx, filepath.Join(work, "fair"), opts, window, windows, interval); err != nil {
			return err
		}
	}
	return noisy(ctx, filepath.Join(work, "noisy"), opts, interval, flood)
}

// start makes a cluster of two nodes with the given shares.
func start(ctx context.Context, dir string, opts cluster.Options, shares map[string]int) (*cluster.Cluster, error) {
	os.MkdirAll(dir, 0o755)
	c, err := cluster.New(dir, opts)
	if err != nil {
		return nil, err
	}
	st := sched.NewStore(c.Store, sched.Params{}, nil)
	for g, v := range shares {
		if _, err := st.SetShares(ctx, g, v); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, name := range []string{"a", "b"} {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := c.Start(sctx, name)
		cancel()
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func add(ctx context.Context, c *cluster.Cluster, group string, n int) error {
	for i := 0; i < n; i += 1000 {
		var batch []jobs.NewJob
		for k := i; k < min(n, i+1000); k++ {
			batch = append(batch, jobs.NewJob{Type: typ, ID: fmt.Sprintf("%s-%05d", group, k), Group: group, Data: []byte(`{"forever":true}`)})
		}
		if err := c.Jobs.AddMany(ctx, batch); err != nil {
			return err
		}
	}
	return nil
}

// running counts the running jobs per group.
func running(ctx context.Context, c *cluster.Cluster) (map[string]int, error) {
	counts := map[string]int{}
	err := c.Jobs.Fold(ctx, typ, jobs.ListOptions{State: jobs.Running, Limit: 1000}, func(in jobs.Info) error {
		counts[in.Group]++
		return nil
	})
	return counts, err
}

func fairness(ctx context.Context, dir string, opts cluster.Options, window time.Duration, windows int, interval time.Duration) error {
	shares := map[string]int{"A": 200, "B": 100, "C": 50}
	c, err := start(ctx, dir, opts, shares)
	if err != nil {
		return err
	}
	defer c.Close()
	total := 0
	for g := range shares {
		total += shares[g]
		if err := add(ctx, c, g, 4*opts.Workers); err != nil {
			return err
		}
	}
	time.Sleep(10 * interval) // settle
	fmt.Println("Fairness under saturation (share of the running jobs, sampled every 100 ms):")
	fmt.Println()
	fmt.Println("| window | A (target 57.1%) | B (target 28.6%) | C (target 14.3%) | weighted Jain |")
	fmt.Println("|---|---|---|---|---|")
	groups := []string{"A", "B", "C"}
	worstJain, worstDev := 1.0, 0.0
	for w := range windows {
		sums := map[string]float64{}
		samples := 0.0
		for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			counts, err := running(ctx, c)
			if err != nil {
				return err
			}
			all := 0
			for _, n := range counts {
				all += n
			}
			if all == 0 {
				continue
			}
			for _, g := range groups {
				sums[g] += float64(counts[g]) / float64(all)
			}
			samples++
		}
		var xs []float64
		row := fmt.Sprintf("| %d |", w+1)
		for _, g := range groups {
			share := sums[g] / samples
			target := float64(shares[g]) / float64(total)
			worstDev = max(worstDev, math.Abs(share-target))
			xs = append(xs, share/float64(shares[g]))
			row += fmt.Sprintf(" %.1f%% |", 100*share)
		}
		j := jain(xs)
		worstJain = min(worstJain, j)
		fmt.Printf("%s %.4f |\n", row, j)
	}
	fmt.Printf("\nWorst window: weighted Jain %.4f (target ≥ 0.99); largest deviation from a target share %.1f points (target ≤ 3).\n\n", worstJain, 100*worstDev)
	return nil
}

// jain is Jain's fairness index of xs.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func noisy(ctx context.Context, dir string, opts cluster.Options, interval time.Duration, flood int) error {
	c, err := start(ctx, dir, opts, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	began := time.Now()
	if err := add(ctx, c, "A", flood); err != nil {
		return err
	}
	fmt.Printf("Noisy neighbour: A added %d jobs in %v.\n", flood, time.Since(began).Round(time.Millisecond))
	time.Sleep(5 * interval) // A fills the cluster, its runs pass min_run_time
	added := time.Now()
	if err := add(ctx, c, "B", 10); err != nil {
		return err
	}
	var waits []time.Duration
	seen := map[string]bool{}
	deadline := added.Add(60 * interval)
	for len(seen) < 10 && time.Now().Before(deadline) {
		for k := range 10 {
			id := fmt.Sprintf("B-%05d", k)
			if seen[id] {
				continue
			}
			in, err := c.Jobs.Get(ctx, typ, id)
			if err != nil {
				return err
			}
			if in.State == jobs.Running {
				seen[id] = true
				waits = append(waits, time.Since(added))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(waits) < 10 {
		return fmt.Errorf("only %d of B's 10 jobs started within 60 intervals", len(waits))
	}
	slices.Sort(waits)
	if os.Getenv("BENCHFAIR_DEBUG") != "" {
		fmt.Println("waits:", waits)
	}
	p99 := waits[len(waits)-1] // with 10 jobs, p99 is the slowest
	fmt.Printf("B's 10 jobs started after %v (median) and %v (p99) = %.2f intervals (target ≤ 2).\n",
		waits[4].Round(time.Millisecond), p99.Round(time.Millisecond), p99.Seconds()/interval.Seconds())
	return nil
}
