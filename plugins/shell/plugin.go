package shell

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/couchjobs/couchjobs/sdk"
)

// TypeName is the job type of shell jobs.
const TypeName = "shell"

// Version is the plugin's version.
const Version = "1.0.0"

// ActivityTimeout is how long a shell job's node may stay silent before
// another node takes the job over; runtime.toml may change it with
// plugins.shell.activity_timeout.
const ActivityTimeout = 30 * time.Second

// New returns the shell plugin, for sdk.Serve (see cmd/couchjobs-shell)
// or sdktest.
func New() *sdk.Plugin {
	w := &worker{now: time.Now, busy: map[int]bool{}}
	p := &sdk.Plugin{
		Name:    "shell",
		Version: Version,
		Types: []sdk.Type{{
			Name:            TypeName,
			ActivityTimeout: ActivityTimeout,
			ConfigSchema:    configSchema,
			Worker:          w,
			Admit:           admit,
		}},
	}
	p.Configure = func(_ context.Context, c *sdk.Config) error {
		cfg, err := configure(c)
		if err != nil {
			return err
		}
		w.cfg = cfg
		w.log = p.Logger
		if w.log == nil {
			w.log = hclog.NewNullLogger()
		}
		return nil
	}
	return p
}

const configSchema = `{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "allow": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "run_as": {"type": "string"},
    "shell": {"type": "string"},
    "output_limit": {"type": "integer", "minimum": 1, "maximum": 1048576},
    "kill_grace": {"type": "string"}
  }
}`
