package shardlimit

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A build without cgo (CGO_ENABLED=0, or a cross build, where the go command turns cgo
// off by default) fails with one error that names cgo and the C SDK, not with a list of
// "undefined: Limiter".
func TestBuildWithoutCgoNamesCgoAndTheSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	for _, env := range [][]string{{"CGO_ENABLED=0"}, {"GOOS=linux", "GOARCH=arm64", "CGO_ENABLED="}} {
		cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("%v: go build succeeded without cgo", env)
		}
		text := string(out)
		if !strings.Contains(text, "needs_cgo") || !strings.Contains(text, "CGO_ENABLED_1") ||
			!strings.Contains(text, "SDK") {
			t.Errorf("%v: the build error does not name cgo and the SDK:\n%s", env, text)
		}
		if strings.Contains(text, "undefined: Limiter") || strings.Contains(text, "undefined: Decision") {
			t.Errorf("%v: the build error lists the package's missing names:\n%s", env, text)
		}
	}
}
