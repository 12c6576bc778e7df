package shell

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/sdk"
)

// worker runs shell jobs on one node.
type worker struct {
	cfg *Config
	log hclog.Logger
	now func() time.Time

	mu   sync.Mutex
	busy map[int]bool // worker numbers in use
}

// slot takes the lowest free worker number, for the executioner field.
func (w *worker) slot() (int, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 1
	for w.busy[n] {
		n++
	}
	w.busy[n] = true
	return n, func() {
		w.mu.Lock()
		delete(w.busy, n)
		w.mu.Unlock()
	}
}

// Run runs a job's steps from its current one, for as long as they may
// run on this node; a step for other nodes sends the job on to them.
func (w *worker) Run(ctx context.Context, job *sdk.Job) error {
	d, err := ParseDoc(job.Data)
	if err != nil {
		return sdk.Fail(err)
	}
	if d.JobStatus != nil {
		job.SetResult(d)
		return nil // already ended: nothing runs twice
	}
	n, release := w.slot()
	defer release()
	r := &runner{w: w, job: job, doc: d, me: Executioner{Node: w.cfg.node, Worker: n},
		log: w.log.With("type", job.Type, "id", job.ID)}
	return r.run(ctx)
}

// runner is one run of a job.
type runner struct {
	w   *worker
	job *sdk.Job
	doc *Doc
	me  Executioner
	log hclog.Logger
}

// run is the step loop. Every state change is stored before what it
// announces happens: a step is recorded running before its command
// starts, so a node that dies mid-step leaves a record that says so.
func (r *runner) run(ctx context.Context) error {
	for r.doc.Step < len(r.doc.Job) {
		st := &r.doc.Job[r.doc.Step]
		if !st.Target.Allows(r.me.Node, r.w.cfg.groups) {
			// The step belongs elsewhere: queue it there, with what is
			// done so far.
			return r.resubmit(time.Time{}, st.Target.Placement())
		}
		next, err := r.step(ctx, st)
		if err != nil || !next {
			return err
		}
		r.doc.Step++
	}
	return r.end(JobSuccess, "")
}

// step runs the current step to its end, or returns an outcome that ends
// the run (a retry later, a stop, the job's failure). next reports that
// the step succeeded and the job goes on.
func (r *runner) step(ctx context.Context, st *Step) (next bool, err error) {
	alt := false
	switch st.StepStatus {
	case StatusRunning, StatusRunningAlt:
		// The node that ran it died, or was stopped mid-step: it is
		// unknown whether the command had its effect.
		st.Lost++
		r.log.Warn("step was lost with its node", "step", r.doc.Step, "on_lost", st.onLost(), "by", st.Executioner)
		switch {
		case st.onLost() == OnLostFail:
			st.StepStatus, st.Error = StatusLost, fmt.Sprintf("lost on node %s; on_lost is fail", executioner(st))
			r.finishStep(st)
			return false, r.end(JobFailed, fmt.Sprintf("step %d: %s", r.doc.Step, st.Error))
		case st.StepStatus == StatusRunningAlt || st.onLost() == OnLostAltDo:
			alt = true
		}
	case StatusSuccess, StatusAltSuccess:
		return true, nil // recorded done, never run again
	}
	if !alt {
		ok, err := r.attempts(ctx, st)
		if err != nil || ok {
			return ok, err
		}
		if st.AltDo == "" {
			st.StepStatus = StatusFailed
			r.finishStep(st)
			return false, r.end(JobFailed, fmt.Sprintf("step %d failed: %s", r.doc.Step, failure(st.ExitCode, st.Error)))
		}
	}
	return r.alt(ctx, st)
}

// attempts runs Do, retrying as the strategy says. ok reports success; a
// failure with no retry left returns ok false and no error.
func (r *runner) attempts(ctx context.Context, st *Step) (ok bool, err error) {
	for {
		now := r.w.now()
		if st.StartTime == nil {
			st.StartTime = &now
		}
		timeout := seconds(st.Timeout)
		if st.Retry.MaxTime > 0 {
			left := st.StartTime.Add(seconds(st.Retry.MaxTime)).Sub(now)
			if left <= 0 {
				st.Error = fmt.Sprintf("max_time %gs spent after %d attempts", st.Retry.MaxTime, st.Attempts)
				return false, nil
			}
			if timeout == 0 || left < timeout {
				timeout = left
			}
		}
		st.Attempts++
		st.StepStatus, st.Executioner, st.RetryAt = StatusRunning, &r.me, nil
		if err := r.save(ctx); err != nil {
			return false, err
		}
		res := r.w.cfg.run(ctx, command{text: st.Do, env: r.env(st), dir: st.Dir, timeout: timeout})
		if err := r.stopped(ctx); err != nil {
			return false, err
		}
		st.ExecTime += res.took.Seconds()
		st.ExitCode = &res.exit
		st.Stdout, st.Stderr = res.stdout.String(), res.stderr.String()
		st.StdoutDropped, st.StderrDropped = res.stdout.Dropped(), res.stderr.Dropped()
		st.Error = ""
		if res.err != nil {
			st.Error = res.err.Error()
		}
		if res.ok() {
			st.StepStatus = StatusSuccess
			r.finishStep(st)
			return true, nil
		}
		r.log.Info("step attempt failed", "step", r.doc.Step, "attempt", st.Attempts, "exit", res.exit, "error", res.err)
		if errors.Is(res.err, ErrNotAllowed) || st.Attempts > st.Retry.MaxRetries {
			return false, nil // a refused command fails the same way every time
		}
		pause := st.Retry.pause(st.Attempts)
		at := r.w.now().Add(pause)
		if st.Retry.MaxTime > 0 && !at.Before(st.StartTime.Add(seconds(st.Retry.MaxTime))) {
			st.Error = fmt.Sprintf("%s; max_time %gs leaves no time for another attempt", st.Error, st.Retry.MaxTime)
			return false, nil
		}
		if pause < localPause && sleep(ctx, pause) == nil {
			continue
		}
		// A longer pause frees the worker: the job waits in the queue,
		// and any node the target allows takes the next attempt. So does
		// a run stopped during a short pause: the attempt ended, so the
		// step is not lost.
		st.StepStatus, st.RetryAt = StatusWaitingRetry, &at
		return false, r.resubmit(at, st.Target.Placement())
	}
}

// localPause is the longest pause between attempts a worker waits out
// itself rather than through the queue.
const localPause = time.Second

// alt runs AltDo after Do failed (or was lost, by policy).
func (r *runner) alt(ctx context.Context, st *Step) (next bool, err error) {
	st.StepStatus, st.Executioner = StatusRunningAlt, &r.me
	if err := r.save(ctx); err != nil {
		return false, err
	}
	res := r.w.cfg.run(ctx, command{text: st.AltDo, env: r.env(st), dir: st.Dir, timeout: seconds(st.Timeout)})
	if err := r.stopped(ctx); err != nil {
		return false, err
	}
	st.ExecTime += res.took.Seconds()
	st.AltExitCode = &res.exit
	st.AltStdout, st.AltStderr = res.stdout.String(), res.stderr.String()
	if res.err != nil {
		st.Error = strings.TrimPrefix(st.Error+"; alt_do: "+res.err.Error(), "; ")
	}
	if !res.ok() {
		st.StepStatus = StatusFailed
		r.finishStep(st)
		return false, r.end(JobFailed, fmt.Sprintf("step %d failed, and so did alt_do: %s", r.doc.Step, failure(st.AltExitCode, res.errText())))
	}
	st.StepStatus = StatusAltSuccess
	r.finishStep(st)
	if st.ContinueOnAltSuccess {
		return true, nil
	}
	return false, r.end(JobFailed, fmt.Sprintf("step %d failed; alt_do succeeded", r.doc.Step))
}

func (r *result) errText() string {
	if r.err == nil {
		return ""
	}
	return r.err.Error()
}

// failure describes how a command failed.
func failure(exit *int, reason string) string {
	switch {
	case reason != "":
		return reason
	case exit != nil:
		return "exit status " + strconv.Itoa(*exit)
	}
	return "no exit status"
}

func executioner(st *Step) string {
	if st.Executioner == nil {
		return "?"
	}
	return fmt.Sprintf("%s (worker %d)", st.Executioner.Node, st.Executioner.Worker)
}

func (r *runner) finishStep(st *Step) {
	now := r.w.now()
	st.FinishTime = &now
}

// save stores the document: the one transaction that must precede a
// command, since it is what tells a later node the step may have run.
func (r *runner) save(ctx context.Context) error {
	if err := r.job.Update(ctx, sdk.Update{Data: r.doc, Fraction: float64(r.doc.Step) / float64(len(r.doc.Job)),
		Message: fmt.Sprintf("step %d of %d", r.doc.Step+1, len(r.doc.Job))}); err != nil {
		if stop := r.stopped(ctx); stop != nil {
			return stop
		}
		return fmt.Errorf("record step %d: %w", r.doc.Step, err)
	}
	return nil
}

// stopped turns a stopped run into its outcome. A canceled job or a lost
// lock ends here; on preemption or shutdown the step was killed midway,
// and the next run treats it as lost (its record still says running).
func (r *runner) stopped(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	reason, _ := sdk.Stopped(ctx)
	r.log.Info("run stopped", "step", r.doc.Step, "reason", reason)
	return context.Cause(ctx)
}

// resubmit ends the run with the document as it is, queued for p at at.
func (r *runner) resubmit(at time.Time, p sdk.Placement) error {
	if err := r.job.SetResult(r.doc); err != nil {
		return err
	}
	return sdk.ResubmitTo(at, p)
}

// end finishes the job with a status.
func (r *runner) end(status, reason string) error {
	r.doc.JobStatus = &status
	if err := r.job.SetResult(r.doc); err != nil {
		return err
	}
	if status == JobFailed {
		r.log.Info("job failed", "step", r.doc.Step, "reason", reason)
		return sdk.Fail(errors.New(reason))
	}
	return nil
}

// env is a step's environment: the plugin's, without go-plugin's
// variables, plus the job's coordinates and the step's own variables.
func (r *runner) env(st *Step) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PLUGIN_") || strings.HasPrefix(kv, "COUCHJOBS_PLUGIN=") {
			continue
		}
		if r.w.cfg.cred != nil && (strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "USER=") || strings.HasPrefix(kv, "LOGNAME=")) {
			continue
		}
		env = append(env, kv)
	}
	if r.w.cfg.cred != nil {
		env = append(env, "HOME="+r.w.cfg.home, "USER="+r.w.cfg.RunAs, "LOGNAME="+r.w.cfg.RunAs)
	}
	env = append(env,
		"COUCHJOBS_JOB_ID="+r.job.ID,
		"COUCHJOBS_STEP="+strconv.Itoa(r.doc.Step),
		"COUCHJOBS_NODE="+r.me.Node,
		"COUCHJOBS_ATTEMPT="+strconv.Itoa(st.Attempts),
	)
	for k, v := range st.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// sleep waits for d or ctx.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
