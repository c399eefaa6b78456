// Command demo-worker is the Go worker of `make demo` (see examples/demo/README.md): it
// sends a fixed number of checks over a shared set of (policy, key) pairs and prints one
// JSON line with what was admitted; the Rust, Python and Node workers do exactly the same.
//
//	go run ./cmd/demo-worker -config ../../shard-config.json [-requests 2400] [-concurrency 16]
//	    [-keys 8] [-policies billing,demo_daily,demo_burst] [-instance 3] [-barrier]
//
// Check j goes to pair (j + 7*instance) % len(pairs), pairs being every policy x keys
// user:0..keys. -barrier waits for standard input to close before sending (the demo starts
// every worker, then releases them together). Progress goes to stderr as "progress DONE/TOTAL".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

func main() {
	config := flag.String("config", "", "config file (required)")
	requests := flag.Int64("requests", 2400, "checks to send")
	concurrency := flag.Int("concurrency", 16, "concurrent callers")
	keys := flag.Int("keys", 8, "keys per policy (user:0..keys)")
	policies := flag.String("policies", "billing,demo_daily,demo_burst", "comma-separated policies")
	instance := flag.Int64("instance", 3, "offsets the order of the checks")
	barrier := flag.Bool("barrier", false, "wait for standard input to close before sending")
	flag.Parse()
	if *config == "" {
		fmt.Fprintln(os.Stderr, "demo-worker: -config is required")
		os.Exit(2)
	}
	limiter, err := shardlimit.NewFromFile(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo-worker:", err)
		os.Exit(2)
	}
	defer limiter.Close()
	ctx := context.Background()

	type pair struct{ policy, key string }
	var pairs []pair
	for _, p := range strings.Split(*policies, ",") {
		// an unknown policy fails now; the check of an unused key also opens the connections
		if _, err := limiter.Check(ctx, "demo:unused:"+p, p, 1); err != nil {
			fmt.Fprintln(os.Stderr, "demo-worker:", err)
			os.Exit(2)
		}
		for k := 0; k < *keys; k++ {
			pairs = append(pairs, pair{p, fmt.Sprintf("user:%d", k)})
		}
	}
	fmt.Fprintln(os.Stderr, "ready")
	if *barrier {
		_, _ = io.Copy(io.Discard, os.Stdin)
	}

	var next, done, allowed, denied, fallback, errs atomic.Int64
	perKey := make([]atomic.Int64, len(pairs))
	step := max(1, *requests/20)
	started := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < *concurrency; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := next.Add(1) - 1
				if j >= *requests {
					return
				}
				i := (j + 7**instance) % int64(len(pairs))
				d, err := limiter.Check(ctx, pairs[i].key, pairs[i].policy, 1)
				switch {
				case err != nil:
					if errs.Add(1) == 1 {
						fmt.Fprintln(os.Stderr, "go worker:", err)
					}
				case d.Source == shardlimit.SourceFallback:
					fallback.Add(1)
				case d.Allowed:
					allowed.Add(1)
					perKey[i].Add(1)
				default:
					denied.Add(1)
				}
				if n := done.Add(1); n%step == 0 {
					fmt.Fprintf(os.Stderr, "progress %d/%d\n", n, *requests)
				}
			}
		}()
	}
	wg.Wait()

	engine := "memory"
	if raw, err := os.ReadFile(*config); err == nil {
		var cfg map[string]json.RawMessage
		if json.Unmarshal(raw, &cfg) == nil && cfg["shards"] != nil {
			engine = "redis"
		}
	}
	keyed := make(map[string]int64, len(pairs))
	for i, p := range pairs {
		keyed[p.policy+"/"+p.key] = perKey[i].Load()
	}
	out, _ := json.Marshal(map[string]any{
		"language":   "go",
		"instance":   *instance,
		"engine":     engine,
		"sent":       *requests,
		"allowed":    allowed.Load(),
		"denied":     denied.Load(),
		"fallback":   fallback.Load(),
		"errors":     errs.Load(),
		"elapsed_ms": time.Since(started).Milliseconds(),
		"per_key":    keyed,
	})
	fmt.Println(string(out))
}
