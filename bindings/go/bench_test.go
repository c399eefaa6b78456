package shardlimit

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCheck64 measures decisions/s through the cgo boundary with 64 goroutines, the
// shape of `shardlimit bench --concurrency 64`: the same policy, keys "bench:0".."bench:K-1"
// used round-robin. By default it starts its own redis-server; set SHARDLIMIT_BENCH_CONFIG
// (a config file) and SHARDLIMIT_BENCH_POLICY to run against the same Redis as the CLI.
// SHARDLIMIT_BENCH_KEYS sets K (default 1000).
func BenchmarkCheck64(b *testing.B) {
	const goroutines = 64
	policy := os.Getenv("SHARDLIMIT_BENCH_POLICY")
	var l *Limiter
	var err error
	if path := os.Getenv("SHARDLIMIT_BENCH_CONFIG"); path != "" {
		l, err = NewFromConfigFile(path)
	} else {
		r := startRedis(b)
		policy = "bench"
		l, err = NewFromJSON(r.config(`"bench":{"algorithm":"token_bucket","capacity":1000000,"refill_per_sec":1000000}`))
	}
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	nkeys := 1000
	if v := os.Getenv("SHARDLIMIT_BENCH_KEYS"); v != "" {
		if nkeys, err = strconv.Atoi(v); err != nil || nkeys < 1 {
			b.Fatalf("SHARDLIMIT_BENCH_KEYS=%q", v)
		}
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:%d", i)
	}
	ctx := context.Background()
	if _, err := l.Check(ctx, "bench:warmup", policy, 1); err != nil { // connect, load the script
		b.Fatal(err)
	}
	var next, failed atomic.Int64
	n := int64(b.N)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				if _, err := l.Check(ctx, keys[i%int64(nkeys)], policy, 1); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d checks failed", failed.Load())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
}
