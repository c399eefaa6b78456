//go:build benchpeers

// One library, one run, for scripts/bench-peers.sh (which alternates the libraries, pins
// this process to one CPU and builds it in a scratch module that requires the peers, so
// the binding's go.mod never does; hence the build tag):
//
//	peers -lib shardlimit|redis_rate -redis redis://127.0.0.1:PORT [-redis-pid PID]
//	      [-total 200000] [-goroutines 64] [-sequential 20000] [-transport host|thread]
//
// The policy: a fixed window of 10^9 per hour over 1000 keys in shardlimit, redis_rate's
// GCRA at 10^9 per hour in redis_rate (its only algorithm); every request admitted. Prints
// one JSON line: decisions/s at -goroutines concurrent callers, p50/p99 of one goroutine's
// sequential calls, and the CPU per decision of this process (/proc/self/stat) and of
// redis-server (/proc/PID/stat) during the concurrent phase.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
)

const (
	keys  = 1000
	limit = 1_000_000_000
)

// cpuOf is the CPU time (µs) of the process whose /proc stat file this is.
func cpuOf(file string) float64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var u, k float64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &k)
	return (u + k) * 1e6 / 100 // USER_HZ = 100
}

func main() {
	lib := flag.String("lib", "shardlimit", "shardlimit or redis_rate")
	url := flag.String("redis", "", "redis://127.0.0.1:PORT")
	redisPid := flag.String("redis-pid", "", "redis-server's pid, for its CPU")
	total := flag.Int64("total", 200_000, "decisions at -goroutines")
	goroutines := flag.Int("goroutines", 64, "concurrent callers")
	sequential := flag.Int("sequential", 20_000, "sequential decisions, for latency")
	transport := flag.String("transport", "", "shardlimit's transport: \"\" (the default: host on plain shards), host or thread")
	flag.Parse()
	ctx := context.Background()

	var check func(key string) bool
	// shardlimit decisions whose source was not Redis: scripts/bench-peers.sh fails the run
	var fallbacks atomic.Int64
	var version string
	switch *lib {
	case "shardlimit":
		l, err := shardlimit.NewFromJSON(fmt.Sprintf(`{"timeout_ms":1000,"shards":[{"name":"bench","url":%q}],
			"policies":{"api":{"algorithm":"fixed_window","limit":%d,"window":"1h"}}}`, *url, limit),
			shardlimit.WithTransport(shardlimit.Transport(*transport)))
		if err != nil {
			panic(err)
		}
		defer l.Close()
		version = "shardlimit (Go, cgo)"
		if *transport != "" {
			version += ", transport " + *transport
		}
		check = func(key string) bool {
			d, err := l.Check(ctx, key, "api", 1)
			if err != nil {
				panic(err)
			}
			// a decision that did not come from Redis (a fallback) is counted, not measured
			if d.Source != shardlimit.SourceRedis {
				fallbacks.Add(1)
			}
			return d.Allowed
		}
	case "redis_rate":
		opt, err := redis.ParseURL(*url)
		if err != nil {
			panic(err)
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		limiter := redis_rate.NewLimiter(rdb)
		rate := redis_rate.PerHour(limit)
		version = "redis_rate v10 + go-redis v9"
		check = func(key string) bool {
			r, err := limiter.Allow(ctx, key, rate)
			if err != nil {
				panic(err)
			}
			return r.Allowed > 0
		}
	default:
		fmt.Fprintf(os.Stderr, "-lib must be shardlimit or redis_rate, got %q\n", *lib)
		os.Exit(2)
	}
	if *url == "" {
		fmt.Fprintln(os.Stderr, "-redis is required")
		os.Exit(2)
	}
	for i := 0; i < 2000; i++ {
		check(fmt.Sprintf("warm:%d", i%keys))
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("user:%d", i)
	}

	var next, denied atomic.Int64
	redisCPU := func() float64 {
		if *redisPid == "" {
			return 0
		}
		return cpuOf("/proc/" + *redisPid + "/stat")
	}
	c0, r0 := cpuOf("/proc/self/stat"), redisCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < *goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= *total {
					return
				}
				if !check(names[i%keys]) {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	c1, r1 := cpuOf("/proc/self/stat"), redisCPU()
	if denied.Load() > 0 {
		panic(fmt.Sprintf("%d checks denied", denied.Load()))
	}

	lat := make([]float64, *sequential)
	for i := range lat {
		t := time.Now()
		check(names[i%keys])
		lat[i] = float64(time.Since(t).Nanoseconds()) / 1000
	}
	sort.Float64s(lat)
	q := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	var redisPer any
	if *redisPid != "" {
		redisPer = (r1 - r0) / float64(*total)
	}
	out, _ := json.Marshal(map[string]any{
		"lib":               *lib,
		"version":           version,
		"go":                runtime.Version(),
		"decisions_per_sec": float64(*total) / secs,
		"p50_us":            q(0.5),
		"p99_us":            q(0.99),
		"client_cpu_us":     (c1 - c0) / float64(*total),
		"redis_cpu_us":      redisPer,
		"decisions":         *total + int64(*sequential) + 2000,
		"fallbacks":         fallbacks.Load(),
	})
	fmt.Println(string(out))
}
