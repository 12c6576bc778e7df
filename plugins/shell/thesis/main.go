// Command thesis reproduces the evaluation of the Uppsala thesis
// "Implementing an eventual consistency job distribution with CouchDB" on
// couchjobs: its four tests, on 1 to 3 host processes of this machine
// with 2 shell workers each, sharing one embedded store. Every job has 3
// steps of `sleep S` (S = 5 s as in the thesis; -sleep scales it down for
// a quick run). It prints our times beside the thesis's, the optimum,
// the overhead, and the store transactions per step; a fifth run kills
// one node with SIGKILL halfway through test 4 and checks that every job
// still finishes, every step recorded once or marked lost and run again.
//
//	go run ./plugins/shell/thesis -sleep 5     # make bench-thesis
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/couchjobs/couchjobs/plugins/internal/cluster"
	"github.com/couchjobs/couchjobs/plugins/shell"
	"github.com/couchjobs/couchjobs/plugins/shell/internal/shelltest"
)

func main() {
	sleep := flag.Float64("sleep", 5, "seconds each step sleeps (the thesis: 5)")
	only := flag.String("tests", "1,2,3,4,4k", "tests to run: 1, 2, 3, 4, 4k (test 4 with a node killed)")
	verbose := flag.Bool("v", false, "show the nodes' logs")
	flag.Parse()
	if err := run(*sleep, strings.Split(*only, ","), *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "thesis:", err)
		os.Exit(1)
	}
}

// scenario is one measured run.
type scenario struct {
	test    string
	nodes   int
	jobs    int
	targets []string // per step; empty: any
	thesis  string
	// optimum is the discrete optimum in steps of S; fluid the thesis's
	// bound where it differs.
	optimum, fluid float64
	kill           bool
}

func scenarios() []scenario {
	return []scenario{
		{test: "1", nodes: 3, jobs: 1, thesis: "15 s, 12 revisions", optimum: 3},
		{test: "2", nodes: 1, jobs: 6, thesis: "51 s", optimum: 9, fluid: 9},
		{test: "2", nodes: 2, jobs: 6, thesis: "31 s", optimum: 6, fluid: 4.5},
		{test: "2", nodes: 3, jobs: 6, thesis: "17 s", optimum: 3, fluid: 3},
		{test: "3", nodes: 2, jobs: 3, targets: []string{"a", "b", "a"}, thesis: "23 s, 6-8 revisions", optimum: 4},
		{test: "4", nodes: 3, jobs: 90, thesis: "3 min 45 s", optimum: 45},
		{test: "4k", nodes: 3, jobs: 90, thesis: "-", optimum: 45, kill: true},
	}
}

func run(sleep float64, only []string, verbose bool) error {
	ctx := context.Background()
	work, bin, err := cluster.Workspace(ctx, "thesis", shelltest.Plugin)
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var logs io.Writer
	if verbose {
		logs = os.Stderr
	}
	fmt.Printf("Steps sleep %gs; 2 workers per node; times from the first add to the last job's end.\n\n", sleep)
	fmt.Println("| Test | Nodes | Jobs | Thesis | Optimum | Ours | Overhead | Tx/step |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for i, sc := range scenarios() {
		if !contains(only, sc.test) {
			continue
		}
		dir := filepath.Join(work, fmt.Sprint("run", i))
		os.MkdirAll(dir, 0o755)
		r, err := measure(ctx, dir, bin, sc, sleep, logs)
		if err != nil {
			return fmt.Errorf("test %s on %d nodes: %w", sc.test, sc.nodes, err)
		}
		opt := sc.optimum * sleep
		optText := fmt.Sprintf("%.1f s", opt)
		if sc.fluid != 0 && sc.fluid != sc.optimum {
			optText = fmt.Sprintf("%.1f s (fluid %.1f s)", opt, sc.fluid*sleep)
		}
		overhead := fmt.Sprintf("%+.1f%%", 100*(r.took.Seconds()-opt)/opt)
		if sc.kill {
			optText += " without the kill"
			overhead = fmt.Sprintf("%d steps lost, run again", r.lost)
		}
		fmt.Printf("| %s | %d | %d | %s | %s | %.2f s | %s | %.2f |\n",
			sc.test, sc.nodes, sc.jobs, sc.thesis, optText, r.took.Seconds(), overhead, r.txPerStep)
	}
	return nil
}

type outcome struct {
	took      time.Duration
	txPerStep float64
	lost      int
}

func measure(ctx context.Context, dir, bin string, sc scenario, sleep float64, logs io.Writer) (outcome, error) {
	// The plugin's own activity timeout (30 s: a heartbeat every 10 s),
	// except where a node is killed: there 5 s, so that its steps move on
	// quickly.
	timeout := shell.ActivityTimeout
	if sc.kill {
		timeout = 5 * time.Second
	}
	c, err := cluster.New(dir, cluster.Options{Bin: bin, Plugin: "shell", Workers: 2, ActivityTimeout: timeout, Log: logs})
	if err != nil {
		return outcome{}, err
	}
	defer c.Close()
	names := []string{"a", "b", "c"}[:sc.nodes]
	nodes := make([]*cluster.Node, len(names))
	for i, name := range names {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		nodes[i], err = c.Start(sctx, name)
		cancel()
		if err != nil {
			return outcome{}, err
		}
	}
	ids := make([]string, sc.jobs)
	docs := make([]map[string]any, sc.jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%03d", i)
		var steps []map[string]any
		for s := range 3 {
			target := "any"
			if sc.targets != nil {
				target = sc.targets[s]
			}
			steps = append(steps, map[string]any{"target": target, "do": fmt.Sprintf("sleep %g", sleep)})
		}
		docs[i] = map[string]any{"creator": "thesis", "job": steps}
	}
	before, err := c.Commits(ctx)
	if err != nil {
		return outcome{}, err
	}
	start := time.Now()
	for i, id := range ids {
		if err := shelltest.Add(ctx, c, id, docs[i]); err != nil {
			return outcome{}, err
		}
	}
	if sc.kill {
		time.AfterFunc(time.Duration(sc.optimum*sleep/2*float64(time.Second)), nodes[len(nodes)-1].Kill)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Duration(10*sc.optimum*sleep*float64(time.Second))+time.Minute)
	defer cancel()
	if err := c.WaitFinished(wctx, shell.TypeName, ids...); err != nil {
		return outcome{}, err
	}
	took := time.Since(start)
	after, err := c.Commits(ctx)
	if err != nil {
		return outcome{}, err
	}
	// Every job succeeded; every step ran once, or was lost with its node
	// and ran once more.
	lost := 0
	for _, id := range ids {
		d, _, err := shelltest.Doc(ctx, c, id)
		if err != nil {
			return outcome{}, err
		}
		if d.JobStatus == nil || *d.JobStatus != shell.JobSuccess {
			return outcome{}, fmt.Errorf("job %s ended %v", id, d.JobStatus)
		}
		for i, st := range d.Job {
			if st.StepStatus != shell.StatusSuccess || st.Attempts != 1+st.Lost || st.Lost > 1 {
				return outcome{}, fmt.Errorf("job %s step %d: %s after %d attempts, %d lost", id, i, st.StepStatus, st.Attempts, st.Lost)
			}
			if sc.targets != nil && st.Executioner.Node != sc.targets[i] {
				return outcome{}, fmt.Errorf("job %s step %d ran on %s, not %s", id, i, st.Executioner.Node, sc.targets[i])
			}
			lost += st.Lost
		}
	}
	if lost > 0 && !sc.kill {
		return outcome{}, fmt.Errorf("%d steps lost without a node killed", lost)
	}
	steps := float64(3 * sc.jobs)
	return outcome{took: took, txPerStep: math.Round(100*float64(after-before)/steps) / 100, lost: lost}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}
