package shardlimit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The module's tests pass where `go get` puts the module (bindings/go alone, no
// repository around it): the tests that need the repository's shared files skip, saying
// so, instead of failing on a path into the repository tree. Runs the tests that read
// such files in a copy of the package made outside the repository.
func TestModuleTestsPassOutsideTheRepository(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the package's tests in a copy")
	}
	if !inRepository() {
		t.Skip("already outside the repository")
	}
	if os.Getenv("SHARDLIMIT_TEST_TRANSPORT") != "" {
		t.Skip("not about the transport: run once, by the default suite")
	}
	dir := filepath.Join(t.TempDir(), "mod")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !(strings.HasSuffix(name, ".go") || name == "go.mod" || name == "go.sum" || name == "README.md") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-count=1", "-v",
		"-run", "TestEveryOperation|TestSpec|Vector|TLS|Readme|Keys|Errors", ".")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("the package's tests fail outside the repository: %v\n%s", err, text)
	}
	if !strings.Contains(text, "which the Go module does not hold") {
		t.Fatalf("no test said it skipped for want of the repository's files:\n%s", text)
	}
}
