package shell_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPluginImportsOnlyTheSDK checks that the plugin binary reaches no
// couchjobs package but the SDK and its own: it never touches the store.
func TestPluginImportsOnlyTheSDK(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "./cmd/couchjobs-shell").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/couchjobs/couchjobs/") &&
			!strings.HasPrefix(pkg, "github.com/couchjobs/couchjobs/sdk") &&
			pkg != "github.com/couchjobs/couchjobs/plugins/shell" &&
			pkg != "github.com/couchjobs/couchjobs/plugins/shell/cmd/couchjobs-shell" {
			t.Errorf("the shell plugin depends on %s", pkg)
		}
	}
}
