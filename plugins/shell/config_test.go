package shell_test

import (
	"encoding/json"

	"github.com/couchjobs/couchjobs/sdk"
)

func sdkConfig(cfg map[string]any) *sdk.Config {
	b, _ := json.Marshal(cfg)
	return &sdk.Config{JSON: b, Node: "n"}
}
