package shardlimit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeSnippets are the ```go blocks of the READMEs a Go user reads (the C SDK's README
// shows Go too).
var readmeSnippets = []string{"../../README.md", "../c/README.md", "README.md"}

// Every ```go block of README.md, bindings/c/README.md and bindings/go/README.md compiles
// and passes go vet:
// each becomes the body of a function (its import lines hoisted) in a module of its own
// that requires this one, with the names the prose gives it (ctx, mux, limiter or l, a
// health handler, a handler, runReport) declared beside it.
func TestReadmeGoSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module with go vet")
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", fmt.Sprintf("module readme\n\ngo 1.22\n\nrequire github.com/shardlimit/shardlimit/bindings/go v0.0.0\n\nreplace github.com/shardlimit/shardlimit/bindings/go => %s\n", here))
	write("common.go", `package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

// what the READMEs' prose gives a snippet
var (
	ctx     = context.Background()
	mux     = http.NewServeMux()
	limiter *shardlimit.Limiter
	l       *shardlimit.Limiter
	handler http.Handler
)

func health(http.ResponseWriter, *http.Request) {}
func runReport()                               {}

// every import used, whichever snippets use them
var (
	_ = errors.Is
	_ = fmt.Sprint
	_ = log.Fatal
	_ = time.Second
)

func main() {}
`)
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	n := 0
	for _, readme := range readmeSnippets {
		if strings.HasPrefix(readme, "../") && !inRepository() {
			continue // the top-level and the C SDK's READMEs are not part of the Go module
		}
		text, err := os.ReadFile(readme)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllStringSubmatch(string(text), -1) {
			var body []string
			for _, line := range strings.Split(m[1], "\n") {
				if !strings.HasPrefix(line, "import ") { // the common file imports it
					body = append(body, "\t"+line)
				}
			}
			src := fmt.Sprintf(`package main

import (
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

var (
	_ = errors.Is
	_ = fmt.Sprint
	_ = log.Fatal
	_ = http.NewServeMux
	_ = time.Second
	_ = shardlimit.NewMemory
)

// from %s, block %d
func snippet%d() error {
%s
	return nil
}
`, readme, n, n, strings.Join(body, "\n"))
			write(fmt.Sprintf("snippet%d.go", n), src)
			n++
		}
	}
	if n < 5 {
		t.Fatalf("%d go blocks in %v: the READMEs have at least 5", n, readmeSnippets)
	}
	cmd := exec.Command("go", "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the READMEs' go blocks do not compile: %v\n%s", err, out)
	}
}
