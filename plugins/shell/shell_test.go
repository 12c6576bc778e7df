package shell_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/plugins/shell"
	"github.com/couchjobs/couchjobs/runtime/jobs"
	"github.com/couchjobs/couchjobs/sdk/sdktest"
)

// run adds a job to a fresh node and waits for it to finish.
func run(t *testing.T, cfg map[string]any, doc string) (*shell.Doc, sdktest.Result) {
	t.Helper()
	h := sdktest.New(t, shell.New(), cfg)
	return finish(t, h, "j", doc)
}

// finish adds a job and waits until it is finished, through any number of
// runs (retries go through the queue).
func finish(t *testing.T, h *sdktest.Harness, id, doc string) (*shell.Doc, sdktest.Result) {
	t.Helper()
	h.Add(shell.TypeName, id, jsonObject(doc))
	return waitFinished(t, h, id)
}

func waitFinished(t *testing.T, h *sdktest.Harness, id string) (*shell.Doc, sdktest.Result) {
	t.Helper()
	for {
		res := h.Wait(shell.TypeName, id)
		if in, err := h.Jobs().Get(context.Background(), shell.TypeName, id); err != nil || in.State != jobs.Finished {
			continue
		}
		d, err := shell.ParseDoc(res.Data)
		if err != nil {
			t.Fatalf("finished job's data: %v\n%s", err, res.Data)
		}
		return d, res
	}
}

type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

func jsonObject(s string) any { return rawJSON(s) }

func TestStepsRunInOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	doc := fmt.Sprintf(`{"creator":"test","job":[
		{"target":"any","do":"echo one >> %[1]s"},
		{"target":"sdktest","do":"echo two >> %[1]s; echo to-stdout; echo to-stderr >&2"},
		{"target":["x","sdktest"],"do":"echo three >> %[1]s"}]}`, out)
	d, res := run(t, nil, doc)
	if res.Outcome != sdktest.Completed || d.JobStatus == nil || *d.JobStatus != shell.JobSuccess || d.Step != 3 {
		t.Fatalf("outcome %s (%s), status %v, step %d", res.Outcome, res.Reason, d.JobStatus, d.Step)
	}
	if b, _ := os.ReadFile(out); string(b) != "one\ntwo\nthree\n" {
		t.Fatalf("steps ran as %q", b)
	}
	for i, st := range d.Job {
		if st.StepStatus != shell.StatusSuccess || st.Attempts != 1 || *st.ExitCode != 0 || st.Executioner == nil ||
			st.Executioner.Node != "sdktest" || st.StartTime == nil || st.FinishTime == nil || st.FinishTime.Before(*st.StartTime) {
			t.Errorf("step %d: %+v", i, st.State)
		}
	}
	if d.Job[1].Stdout != "to-stdout\n" || d.Job[1].Stderr != "to-stderr\n" {
		t.Errorf("output %q / %q", d.Job[1].Stdout, d.Job[1].Stderr)
	}
	if d.Creator != "test" {
		t.Errorf("creator %q", d.Creator)
	}
}

func TestRetries(t *testing.T) {
	t.Parallel()
	h := sdktest.New(t, shell.New(), nil)
	// Succeeds on the third attempt: two retries, paused 50 then 100 ms.
	d, _ := finish(t, h, "third", `{"job":[{"do":"test $COUCHJOBS_ATTEMPT -ge 3",
		"retry_strategy":{"max_retries":5,"sleep":0.05,"sleep_factor":2,"sleep_max":0.1}}]}`)
	st := d.Job[0]
	if *d.JobStatus != shell.JobSuccess || st.Attempts != 3 || st.StepStatus != shell.StatusSuccess {
		t.Fatalf("status %s, step %+v", *d.JobStatus, st.State)
	}
	if took := st.FinishTime.Sub(*st.StartTime); took < 150*time.Millisecond {
		t.Errorf("three attempts with pauses of 50 and 100 ms took %v", took)
	}
	// Retries run out: the step and the job fail with the exit status.
	d, res := finish(t, h, "never", `{"job":[{"do":"exit 7","retry_strategy":{"max_retries":2}},{"do":"true"}]}`)
	st = d.Job[0]
	if res.Outcome != sdktest.Failed || *d.JobStatus != shell.JobFailed || st.Attempts != 3 || *st.ExitCode != 7 ||
		st.StepStatus != shell.StatusFailed || d.Job[1].StepStatus != "" {
		t.Fatalf("outcome %s, status %s, step %+v", res.Outcome, *d.JobStatus, st.State)
	}
	if !strings.Contains(res.Reason, "exit status 7") {
		t.Errorf("reason %q", res.Reason)
	}
	// A pause of a second or more waits in the queue, not in a worker.
	d, _ = finish(t, h, "queued", `{"job":[{"do":"test $COUCHJOBS_ATTEMPT -ge 2","retry_strategy":{"max_retries":1,"sleep":1}}]}`)
	if st := d.Job[0]; *d.JobStatus != shell.JobSuccess || st.Attempts != 2 || st.FinishTime.Sub(*st.StartTime) < time.Second {
		t.Fatalf("status %s, step %+v", *d.JobStatus, st.State)
	}
}

func TestMaxTime(t *testing.T) {
	t.Parallel()
	start := time.Now()
	d, _ := run(t, nil, `{"job":[{"do":"sleep 30","retry_strategy":{"max_retries":10,"max_time":0.5}}]}`)
	st := d.Job[0]
	if *d.JobStatus != shell.JobFailed || st.Attempts != 1 || *st.ExitCode != -1 || !strings.Contains(st.Error, "timed out") {
		t.Fatalf("status %s, step %+v", *d.JobStatus, st.State)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("max_time 0.5s let the step run %v", took)
	}
	// Short attempts stop retrying once max_time is spent.
	d, _ = run(t, nil, `{"job":[{"do":"sleep 0.2; exit 1","retry_strategy":{"max_retries":100,"sleep":0.1,"max_time":1}}]}`)
	if st := d.Job[0]; st.Attempts < 2 || st.Attempts > 5 || st.StepStatus != shell.StatusFailed {
		t.Fatalf("step %+v", st.State)
	}
}

func TestAltDo(t *testing.T) {
	t.Parallel()
	h := sdktest.New(t, shell.New(), nil)
	for _, tc := range []struct {
		name, step    string
		status, step0 string
		alt           int
	}{
		{"alt succeeds, job fails", `{"do":"exit 3","alt_do":"echo fallback"}`, shell.JobFailed, shell.StatusAltSuccess, 0},
		{"alt succeeds, job goes on", `{"do":"exit 3","alt_do":"echo fallback","continue_on_alt_success":true}`, shell.JobSuccess, shell.StatusAltSuccess, 0},
		{"alt fails too", `{"do":"exit 3","alt_do":"exit 4","continue_on_alt_success":true}`, shell.JobFailed, shell.StatusFailed, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := finish(t, h, strings.ReplaceAll(tc.name, " ", "-"), `{"job":[`+tc.step+`,{"do":"echo next"}]}`)
			st := d.Job[0]
			if *d.JobStatus != tc.status || st.StepStatus != tc.step0 || *st.ExitCode != 3 || *st.AltExitCode != tc.alt {
				t.Fatalf("status %s, step %+v", *d.JobStatus, st.State)
			}
			if tc.alt == 0 && st.AltStdout != "fallback\n" {
				t.Errorf("alt_do stdout %q", st.AltStdout)
			}
			if ran := d.Job[1].StepStatus == shell.StatusSuccess; ran != (tc.status == shell.JobSuccess) {
				t.Errorf("next step status %q", d.Job[1].StepStatus)
			}
		})
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	d, _ := run(t, map[string]any{"kill_grace": "100ms"},
		fmt.Sprintf(`{"job":[{"do":"sleep 60 & echo $! > %s; wait","timeout":0.3}]}`, pidFile))
	st := d.Job[0]
	if *d.JobStatus != shell.JobFailed || !strings.Contains(st.Error, "timed out after 300ms") || *st.ExitCode != -1 {
		t.Fatalf("status %s, step %+v", *d.JobStatus, st.State)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("a 0.3s timeout took %v", took)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the step's background child %d outlived the timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether a process runs (a zombie does not).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func TestOutputLimit(t *testing.T) {
	t.Parallel()
	d, _ := run(t, map[string]any{"output_limit": 100},
		`{"job":[{"do":"head -c 10000 /dev/zero | tr '\\0' a; printf END; printf 'short' >&2"}]}`)
	st := d.Job[0]
	if len(st.Stdout) != 100 || !strings.HasSuffix(st.Stdout, "aaaEND") || st.StdoutDropped != 9903 {
		t.Fatalf("stdout %d bytes (%q...), dropped %d", len(st.Stdout), st.Stdout[:10], st.StdoutDropped)
	}
	if st.Stderr != "short" || st.StderrDropped != 0 {
		t.Fatalf("stderr %q, dropped %d", st.Stderr, st.StderrDropped)
	}
}

func TestEnvAndDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d, _ := run(t, nil, fmt.Sprintf(`{"job":[{"do":"pwd; echo $GREETING $COUCHJOBS_JOB_ID $COUCHJOBS_STEP; echo ${COUCHJOBS_PLUGIN:-no-cookie}","dir":%q,"env":{"GREETING":"hello"}}]}`, dir))
	if want := dir + "\nhello j 0\nno-cookie\n"; d.Job[0].Stdout != want {
		t.Fatalf("stdout %q, want %q", d.Job[0].Stdout, want)
	}
	d, _ = run(t, nil, `{"job":[{"do":"true","dir":"/no/such/dir"}]}`)
	if st := d.Job[0]; *d.JobStatus != shell.JobFailed || !strings.Contains(st.Error, `"/no/such/dir": not a directory`) {
		t.Fatalf("status %s, step %+v", *d.JobStatus, st.State)
	}
}

func TestAllowlist(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	h := sdktest.New(t, shell.New(), map[string]any{"allow": []string{"echo ", "touch " + out}})
	d, _ := finish(t, h, "ok", fmt.Sprintf(`{"job":[{"do":"echo 'a  b' c"},{"do":"touch %s"}]}`, out))
	if *d.JobStatus != shell.JobSuccess || d.Job[0].Stdout != "a  b c\n" {
		t.Fatalf("status %s, stdout %q (%s)", *d.JobStatus, d.Job[0].Stdout, d.Job[0].Error)
	}
	for id, cmd := range map[string]string{
		"prefix":     "ls /",
		"chained":    "echo hi; touch /tmp/pwned",
		"expansion":  "echo $(touch /tmp/pwned)",
		"other-file": "touch " + filepath.Dir(out) + "/elsewhere",
	} {
		d, res := finish(t, h, id, fmt.Sprintf(`{"job":[{"do":%q,"retry_strategy":{"max_retries":3}}]}`, cmd))
		st := d.Job[0]
		if *d.JobStatus != shell.JobFailed || st.Attempts != 1 || !strings.Contains(st.Error, "not allowed") {
			t.Errorf("%q: status %s, outcome %s, step %+v", cmd, *d.JobStatus, res.Outcome, st.State)
		}
	}
	if _, err := os.Stat(filepath.Dir(out) + "/elsewhere"); err == nil {
		t.Fatal("a refused command ran")
	}
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  map[string]any
		want string
	}{
		{map[string]any{"allow": []string{""}}, "allow.0: an empty prefix"},
		{map[string]any{"output_limit": -1}, "output_limit"},
		{map[string]any{"run_as": "no-such-user-here"}, "run_as: user"},
		{map[string]any{"shell": "/no/shell"}, "shell: stat /no/shell"},
		{map[string]any{"alow": []string{"x"}}, `unknown field "alow"`},
	} {
		p := shell.New()
		err := p.Configure(context.Background(), sdkConfig(tc.cfg))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestAddRefusesBadJobs(t *testing.T) {
	t.Parallel()
	h := sdktest.New(t, shell.New(), nil)
	err := h.TryAdd(shell.TypeName, "bad", jsonObject(`{"job":[{"target":"any","retry_strategy":{"max_retries":-2}}]}`))
	if !errors.Is(err, jobs.ErrInvalid) || !strings.Contains(err.Error(), `step 0: "do" is missing`) {
		t.Fatalf("add: %v", err)
	}
	if _, err := h.Jobs().Get(context.Background(), shell.TypeName, "bad"); !errors.Is(err, jobs.ErrNotFound) {
		t.Fatalf("a refused job was stored: %v", err)
	}
}

func TestRunAs(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	d, _ := run(t, map[string]any{"run_as": "nobody"}, `{"job":[{"do":"id -un; echo $HOME","dir":"/"}]}`)
	if out := d.Job[0].Stdout; !strings.HasPrefix(out, "nobody\n") {
		t.Fatalf("ran as %q (%s)", out, d.Job[0].Error)
	}
}
