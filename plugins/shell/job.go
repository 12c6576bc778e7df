package shell

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/couchjobs/couchjobs/sdk"
)

// Doc is a shell job's data: the job document of the thesis, with the
// state fields the runtime writes.
type Doc struct {
	// Creator names who submitted the job, for display.
	Creator string `json:"creator,omitempty"`
	// Step is the index of the current step.
	Step int `json:"step"`
	// JobStatus is null while the job runs, then "success" or "failed".
	JobStatus *string `json:"job_status"`
	// Job is the list of steps, run in order.
	Job []Step `json:"job"`
	// Meta is the host's bookkeeping (outcome, crashes), kept as is.
	Meta json.RawMessage `json:"_couchjobs,omitempty"`
}

// Job statuses.
const (
	JobSuccess = "success"
	JobFailed  = "failed"
)

// Step is one shell step.
type Step struct {
	// Target says which nodes may run the step.
	Target Target `json:"target"`
	// Do is the command.
	Do string `json:"do"`
	// AltDo runs when every attempt of Do failed.
	AltDo string `json:"alt_do,omitempty"`
	// Retry says how often, and how far apart, Do is tried.
	Retry Retry `json:"retry_strategy"`
	// Timeout, in seconds, bounds one attempt (of Do or AltDo); the whole
	// process group is killed when it runs out. 0: no limit.
	Timeout float64 `json:"timeout,omitempty"`
	// Env adds environment variables; Dir is the working directory (an
	// absolute path; default the plugin's).
	Env map[string]string `json:"env,omitempty"`
	Dir string            `json:"dir,omitempty"`
	// OnLost says what to do when the node running the step died, so that
	// it is unknown whether the step ran: "retry" (the default, for
	// idempotent steps), "alt_do", or "fail".
	OnLost string `json:"on_lost,omitempty"`
	// ContinueOnAltSuccess lets the job go on when AltDo succeeded;
	// otherwise the job fails after AltDo either way.
	ContinueOnAltSuccess bool `json:"continue_on_alt_success,omitempty"`

	State
}

// State is what the runtime records about a step.
type State struct {
	// StepStatus is empty until the step starts; see the Status constants.
	StepStatus string `json:"step_status,omitempty"`
	// Executioner is the node and worker that ran (or runs) the step.
	Executioner *Executioner `json:"executioner,omitempty"`
	// StartTime is when the first attempt started, FinishTime when the
	// step ended; ExecTime sums the attempts' run time, in seconds.
	StartTime  *time.Time `json:"start_time,omitempty"`
	FinishTime *time.Time `json:"finish_time,omitempty"`
	ExecTime   float64    `json:"exec_time,omitempty"`
	// Attempts counts the runs of Do; Lost counts runs whose node died.
	Attempts int `json:"attempts,omitempty"`
	Lost     int `json:"lost,omitempty"`
	// RetryAt is when the next attempt is due, while StepStatus is
	// "waiting_retry".
	RetryAt *time.Time `json:"retry_at,omitempty"`
	// ExitCode is the last attempt's exit status (-1: killed or not
	// started); AltExitCode AltDo's.
	ExitCode    *int `json:"exit_code,omitempty"`
	AltExitCode *int `json:"alt_exit_code,omitempty"`
	// Stdout and Stderr are the tails of the last attempt's output,
	// AltStdout and AltStderr AltDo's; *Dropped count the bytes cut off.
	Stdout        string `json:"stdout,omitempty"`
	Stderr        string `json:"stderr,omitempty"`
	StdoutDropped int64  `json:"stdout_dropped,omitempty"`
	StderrDropped int64  `json:"stderr_dropped,omitempty"`
	AltStdout     string `json:"alt_stdout,omitempty"`
	AltStderr     string `json:"alt_stderr,omitempty"`
	// Error says why the last attempt failed, beyond its exit status (a
	// timeout, a refused command, a missing directory).
	Error string `json:"error,omitempty"`
}

// Step statuses.
const (
	StatusRunning      = "running"       // Do runs (or ran on a node that died)
	StatusWaitingRetry = "waiting_retry" // Do failed; the next attempt is due at RetryAt
	StatusRunningAlt   = "running_alt"   // AltDo runs (or ran on a node that died)
	StatusSuccess      = "success"
	StatusAltSuccess   = "alt_success" // Do failed, AltDo succeeded
	StatusFailed       = "failed"
	StatusLost         = "lost" // the node died mid-step and on_lost is "fail"
)

// On-lost policies.
const (
	OnLostRetry = "retry"
	OnLostAltDo = "alt_do"
	OnLostFail  = "fail"
)

// Executioner names who runs a step.
type Executioner struct {
	Node   string `json:"node"`
	Worker int    `json:"worker"`
}

// Retry is a step's retry strategy. Times are in seconds.
type Retry struct {
	// MaxRetries is how many times Do is run again after it failed.
	MaxRetries int `json:"max_retries"`
	// Sleep is the pause before the first retry; each later pause is
	// SleepFactor (default 1) times the one before, capped at SleepMax
	// (0: no cap).
	Sleep       float64 `json:"sleep,omitempty"`
	SleepFactor float64 `json:"sleep_factor,omitempty"`
	SleepMax    float64 `json:"sleep_max,omitempty"`
	// MaxTime bounds all attempts of Do together, from the first start:
	// the running attempt is killed and no retry starts once it is spent.
	// 0: no limit.
	MaxTime float64 `json:"max_time,omitempty"`
}

// pause returns the pause before the retry that follows the given
// number of failed attempts.
func (r Retry) pause(failed int) time.Duration {
	factor := r.SleepFactor
	if factor == 0 {
		factor = 1
	}
	s := r.Sleep * math.Pow(factor, float64(max(failed-1, 0)))
	if r.SleepMax > 0 {
		s = min(s, r.SleepMax)
	}
	return seconds(s)
}

// seconds converts a number of seconds to a Duration, saturating.
func seconds(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// Target says which nodes may run a step: any node, one node, one of a
// list of nodes, or the nodes of a node group. In JSON: "any", "NAME",
// ["A", "B"], or {"group": "NAME"}.
type Target struct {
	Any   bool
	Nodes []string
	Group string
}

var nodeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// UnmarshalJSON reads the four target forms.
func (t *Target) UnmarshalJSON(b []byte) error {
	*t = Target{}
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		return errors.New(`target is null: want "any", a node name, a list of node names, or {"group": NAME}`)
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s == "any" {
			t.Any = true
			return nil
		}
		t.Nodes = []string{s}
	case len(b) > 0 && b[0] == '[':
		if err := json.Unmarshal(b, &t.Nodes); err != nil {
			return fmt.Errorf("target: a list must hold node names: %w", err)
		}
		if len(t.Nodes) == 0 {
			return errors.New("target: the node list is empty")
		}
	case len(b) > 0 && b[0] == '{':
		var g map[string]json.RawMessage
		if err := json.Unmarshal(b, &g); err != nil {
			return err
		}
		raw, ok := g["group"]
		if !ok || len(g) != 1 {
			return fmt.Errorf(`target %s: an object target must be {"group": NAME}`, b)
		}
		if err := json.Unmarshal(raw, &t.Group); err != nil || !nodeName.MatchString(t.Group) {
			return fmt.Errorf("target %s: bad group name", b)
		}
		return nil
	default:
		return fmt.Errorf(`target %s: want "any", a node name, a list of node names, or {"group": NAME}`, b)
	}
	for _, n := range t.Nodes {
		if !nodeName.MatchString(n) {
			return fmt.Errorf("target: node name %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", n)
		}
	}
	return nil
}

// MarshalJSON writes the target in the form it was read in.
func (t Target) MarshalJSON() ([]byte, error) {
	switch {
	case t.Group != "":
		return json.Marshal(map[string]string{"group": t.Group})
	case len(t.Nodes) == 1:
		return json.Marshal(t.Nodes[0])
	case len(t.Nodes) > 1:
		return json.Marshal(t.Nodes)
	}
	return []byte(`"any"`), nil
}

// Placement is where the runtime queues a step for.
func (t Target) Placement() sdk.Placement {
	switch {
	case t.Group != "":
		return sdk.InGroup(t.Group)
	case len(t.Nodes) > 0:
		return sdk.OnNodes(t.Nodes...)
	}
	return sdk.AnyNode
}

// Allows reports whether a node may run the step.
func (t Target) Allows(node string, groups []string) bool {
	switch {
	case t.Group != "":
		return slices.Contains(groups, t.Group)
	case len(t.Nodes) > 0:
		return slices.Contains(t.Nodes, node)
	}
	return true
}

// MaxSteps bounds a job's steps.
const MaxSteps = 1000

// ParseDoc decodes a job document strictly (an unknown field is an error,
// so a misspelt option does not pass unnoticed) and validates it.
func ParseDoc(data []byte) (*Doc, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d Doc
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("shell job: %w", err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate checks a job document; the error names the step and field.
func (d *Doc) Validate() error {
	if len(d.Job) == 0 {
		return errors.New(`shell job: "job" has no steps`)
	}
	if len(d.Job) > MaxSteps {
		return fmt.Errorf(`shell job: "job" has %d steps, more than %d`, len(d.Job), MaxSteps)
	}
	if d.Step < 0 || d.Step > len(d.Job) {
		return fmt.Errorf(`shell job: "step" %d is outside 0..%d`, d.Step, len(d.Job))
	}
	if d.JobStatus != nil && *d.JobStatus != JobSuccess && *d.JobStatus != JobFailed {
		return fmt.Errorf(`shell job: "job_status" %q: want null, "success" or "failed"`, *d.JobStatus)
	}
	for i := range d.Job {
		if err := d.Job[i].validate(); err != nil {
			return fmt.Errorf("shell job: step %d: %w", i, err)
		}
	}
	return nil
}

func (s *Step) validate() error {
	r := s.Retry
	switch {
	case strings.TrimSpace(s.Do) == "":
		return errors.New(`"do" is missing`)
	case r.MaxRetries < 0:
		return fmt.Errorf("retry_strategy.max_retries %d is negative", r.MaxRetries)
	case r.Sleep < 0 || r.SleepMax < 0 || r.MaxTime < 0:
		return errors.New("retry_strategy: sleep, sleep_max and max_time must not be negative")
	case r.SleepFactor != 0 && r.SleepFactor < 1:
		return fmt.Errorf("retry_strategy.sleep_factor %g: want at least 1", r.SleepFactor)
	case s.Timeout < 0:
		return fmt.Errorf("timeout %g is negative", s.Timeout)
	case s.Dir != "" && !filepath.IsAbs(s.Dir):
		return fmt.Errorf("dir %q is not an absolute path", s.Dir)
	}
	switch s.OnLost {
	case "", OnLostRetry, OnLostFail:
	case OnLostAltDo:
		if s.AltDo == "" {
			return errors.New(`on_lost "alt_do" needs an "alt_do" command`)
		}
	default:
		return fmt.Errorf(`on_lost %q: want "retry", "alt_do" or "fail"`, s.OnLost)
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
	}
	if strings.ContainsRune(s.Do, 0) || strings.ContainsRune(s.AltDo, 0) {
		return errors.New("a command holds a NUL byte")
	}
	return nil
}

// onLost returns the step's policy, with its default.
func (s *Step) onLost() string {
	if s.OnLost == "" {
		return OnLostRetry
	}
	return s.OnLost
}

// Prepare checks a new job's data and returns it normalized (state of
// the steps to run cleared), with the placement of its first step. The
// host calls it, as the type's Admit hook, for every job added through
// it; a program adding jobs to the store itself calls it too.
func Prepare(data []byte) (json.RawMessage, sdk.Placement, error) {
	d, err := ParseDoc(data)
	if err != nil {
		return nil, "", err
	}
	if d.JobStatus != nil {
		return nil, "", fmt.Errorf(`shell job: "job_status" is %q: a new job has null`, *d.JobStatus)
	}
	if d.Step == len(d.Job) {
		return nil, "", fmt.Errorf(`shell job: "step" %d: a new job starts at one of its steps`, d.Step)
	}
	for i := d.Step; i < len(d.Job); i++ {
		d.Job[i].State = State{}
	}
	d.Meta = nil
	b, err := json.Marshal(d)
	if err != nil {
		return nil, "", err
	}
	return b, d.Job[d.Step].Target.Placement(), nil
}

// admit is the type's Admit hook.
func admit(_ context.Context, a *sdk.Admission) error {
	data, p, err := Prepare(a.Data)
	if err != nil {
		return err
	}
	a.Data, a.Placement = data, p
	return nil
}
