// Install test of the Go module (scripts/test-dist.sh): check PORT
package main

import (
	"context"
	"fmt"
	"os"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

func main() {
	config := `{"shards":[{"name":"a","url":"redis://127.0.0.1:` + os.Args[1] + `"}],"timeout_ms":2000,` +
		`"policies":{"p":{"algorithm":"fixed_window","limit":5,"window":"1h"}}}`
	limiter, err := shardlimit.NewFromJSON(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer limiter.Close()
	admitted := 0
	for i := 0; i < 8; i++ {
		d, err := limiter.Check(context.Background(), "user:go", "p", 1)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if d.Allowed != (i < 5) || d.Shard != 0 {
			fmt.Fprintf(os.Stderr, "check %d: allowed=%v shard=%d\n", i, d.Allowed, d.Shard)
			os.Exit(1)
		}
		if d.Allowed {
			admitted++
		}
	}
	fmt.Printf("go: admitted %d of 8 (limit 5)\n", admitted)
}
