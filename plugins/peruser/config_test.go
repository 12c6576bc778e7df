package peruser_test

import (
	"encoding/json"

	"github.com/couchjobs/couchjobs/sdk"
)

type sdkConfig struct{ JSON json.RawMessage }

func (c *sdkConfig) c() *sdk.Config { return &sdk.Config{JSON: c.JSON, Node: "n"} }
