package shell

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/couchjobs/couchjobs/sdk"
)

func TestPrepareRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc, want string }{
		{"not json", `{`, "unexpected EOF"},
		{"no steps", `{"job":[]}`, `"job" has no steps`},
		{"missing do", `{"job":[{"target":"any"}]}`, `step 0: "do" is missing`},
		{"blank do", `{"job":[{"do":"ls"},{"do":"  "}]}`, `step 1: "do" is missing`},
		{"unknown target form", `{"job":[{"target":5,"do":"ls"}]}`, "target 5: want"},
		{"object target", `{"job":[{"target":{"rack":"r1"},"do":"ls"}]}`, `{"group": NAME}`},
		{"null target", `{"job":[{"target":null,"do":"ls"}]}`, "target is null"},
		{"empty list", `{"job":[{"target":[],"do":"ls"}]}`, "node list is empty"},
		{"bad node", `{"job":[{"target":"a b","do":"ls"}]}`, `node name "a b"`},
		{"negative retries", `{"job":[{"do":"ls","retry_strategy":{"max_retries":-1}}]}`, "max_retries -1 is negative"},
		{"negative sleep", `{"job":[{"do":"ls","retry_strategy":{"sleep":-1}}]}`, "must not be negative"},
		{"shrinking sleep", `{"job":[{"do":"ls","retry_strategy":{"sleep_factor":0.5}}]}`, "sleep_factor 0.5"},
		{"negative timeout", `{"job":[{"do":"ls","timeout":-1}]}`, "timeout -1"},
		{"relative dir", `{"job":[{"do":"ls","dir":"tmp"}]}`, `dir "tmp"`},
		{"bad on_lost", `{"job":[{"do":"ls","on_lost":"ignore"}]}`, `on_lost "ignore"`},
		{"alt_do policy without alt_do", `{"job":[{"do":"ls","on_lost":"alt_do"}]}`, `needs an "alt_do"`},
		{"bad env", `{"job":[{"do":"ls","env":{"A=B":"c"}}]}`, `env "A=B"`},
		{"typo", `{"job":[{"do":"ls","retries":3}]}`, `unknown field "retries"`},
		{"finished", `{"job_status":"success","job":[{"do":"ls"}]}`, "a new job has null"},
		{"bad status", `{"job_status":"done","job":[{"do":"ls"}]}`, `"job_status" "done"`},
		{"step past the end", `{"step":1,"job":[{"do":"ls"}]}`, "starts at one of its steps"},
		{"negative step", `{"step":-1,"job":[{"do":"ls"}]}`, "outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Prepare([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestPrepare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		target string
		want   sdk.Placement
	}{
		{`"any"`, sdk.AnyNode},
		{`"a"`, "node:a"},
		{`["b","a"]`, "nodes:b,a"},
		{`["a"]`, "node:a"},
		{`{"group":"gpu"}`, "group:gpu"},
	} {
		doc := `{"creator":"me","step":1,"job":[{"do":"ls","step_status":"success"},{"target":` + tc.target + `,"do":"ls","step_status":"failed","attempts":3}]}`
		data, p, err := Prepare([]byte(doc))
		if err != nil || p != tc.want {
			t.Fatalf("target %s: placement %q, %v; want %q", tc.target, p, err, tc.want)
		}
		var d Doc
		json.Unmarshal(data, &d)
		// Done steps keep their state; the steps to run start afresh.
		if d.Job[0].StepStatus != StatusSuccess || d.Job[1].StepStatus != "" || d.Job[1].Attempts != 0 || d.JobStatus != nil {
			t.Fatalf("prepared %s", data)
		}
		var back struct {
			Job []struct{ Target json.RawMessage } `json:"job"`
		}
		json.Unmarshal(data, &back)
		if want := strings.Replace(tc.target, `["a"]`, `"a"`, 1); string(back.Job[1].Target) != want {
			t.Errorf("target %s written back as %s", tc.target, back.Job[1].Target)
		}
	}
}

func TestRetryPause(t *testing.T) {
	t.Parallel()
	r := Retry{Sleep: 1, SleepFactor: 2, SleepMax: 5}
	var got []time.Duration
	for failed := 1; failed <= 5; failed++ {
		got = append(got, r.pause(failed))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pauses %v, want %v", got, want)
		}
	}
	if p := (Retry{Sleep: 0.5}).pause(3); p != 500*time.Millisecond {
		t.Fatalf("default factor 1: pause %v", p)
	}
}

func TestSimpleCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text string
		want []string // nil: refused
	}{
		{"echo hi", []string{"echo", "hi"}},
		{`echo "a b" 'c d' e\ f`, []string{"echo", "a b", "c d", "e f"}},
		{"echo hi; rm -rf /", nil},
		{"echo hi && ls", nil},
		{"echo hi | cat", nil},
		{"echo hi > /etc/passwd", nil},
		{"echo $HOME", nil},
		{`echo "$HOME"`, nil},
		{"echo $(id)", nil},
		{"echo `id`", nil},
		{"echo *", nil},
		{"FOO=1 echo", nil},
		{"echo hi &", nil},
		{"", nil},
		{"if true; then ls; fi", nil},
	} {
		got, err := simpleCommand(tc.text)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%q passed as %q", tc.text, got)
			}
			continue
		}
		if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%q: %q, %v; want %q", tc.text, got, err, tc.want)
		}
	}
}

func TestTail(t *testing.T) {
	t.Parallel()
	tl := newTail(8)
	tl.Write([]byte("hello "))
	tl.Write([]byte("wonderful "))
	tl.Write([]byte("world"))
	if tl.String() != "ul world" || tl.Dropped() != 13 {
		t.Fatalf("tail %q, dropped %d", tl.String(), tl.Dropped())
	}
	// A multi-byte character cut in half at the front is dropped.
	tl = newTail(4)
	tl.Write([]byte("xé€"))
	if s := tl.String(); s != "€" {
		t.Fatalf("tail %q", s)
	}
}

func FuzzParseDoc(f *testing.F) {
	f.Add([]byte(`{"job":[{"target":["a","b"],"do":"ls","retry_strategy":{"max_retries":2}}]}`))
	f.Add([]byte(`{"step":0,"job_status":null,"job":[{"target":{"group":"g"},"do":"x","alt_do":"y","on_lost":"alt_do"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDoc(b)
		if err != nil {
			return
		}
		// A valid document survives its own round trip.
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseDoc(out); err != nil {
			t.Fatalf("%s re-parsed: %v", out, err)
		}
	})
}
