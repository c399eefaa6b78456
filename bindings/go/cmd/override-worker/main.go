// Command override-worker is the Go worker of the cross-language override test
// (scripts/test-overrides.sh, tests/cross/overrides.py): one long-lived limiter that checks
// -key under -policy each time a line "check" arrives on standard input, printing the
// decision as one JSON line. The Rust and Node workers do exactly the same.
//
//	go run ./cmd/override-worker -config CONFIG.json -policy api -key tenant:acme
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

func main() {
	config := flag.String("config", "", "config file (required)")
	policy := flag.String("policy", "", "policy name (required)")
	key := flag.String("key", "", "key (required)")
	flag.Parse()
	if *config == "" || *policy == "" || *key == "" {
		fmt.Fprintln(os.Stderr, "override-worker: -config, -policy and -key are required")
		os.Exit(2)
	}
	l, err := shardlimit.NewFromFile(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer l.Close()
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		if strings.TrimSpace(in.Text()) != "check" {
			continue
		}
		d, err := l.Check(context.Background(), *key, *policy, 1)
		if err != nil {
			_ = out.Encode(map[string]any{"lang": "go", "error": err.Error()})
			continue
		}
		_ = out.Encode(map[string]any{
			"lang": "go", "allowed": d.Allowed, "limit": d.Limit, "remaining": d.Remaining,
			"policy": d.Policy, "source": d.Source.String(),
		})
	}
}
