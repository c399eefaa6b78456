// rlsload drives a rate limit service (Envoy's RLS v3, ShouldRateLimit) with a bounded
// load, for scripts/bench-serve.sh: the same requests for shardlimit serve and for Lyft's
// ratelimit. It prints one JSON line: decisions/s, latency percentiles and its own CPU.
//
// A decision is a response without a gRPC error; errors are counted apart and never as
// decisions (the services are set up so that every answered request was decided by Redis:
// see the script).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func cpuMicros() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Sec*1e6 + int64(ru.Utime.Usec) + ru.Stime.Sec*1e6 + int64(ru.Stime.Usec)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "host:port, or unix:/path")
	domain := flag.String("domain", "bench", "the request's domain")
	descs := flag.Int("descriptors", 1, "descriptors per request (1..8): descriptor i is [{d<i>, <random key>}]")
	keys := flag.Int("keys", 1000, "distinct values per descriptor")
	conc := flag.Int("concurrency", 32, "requests in flight")
	conns := flag.Int("conns", 2, "gRPC connections (HTTP/2), requests spread over them")
	dur := flag.Duration("duration", 5*time.Second, "how long to measure")
	warm := flag.Duration("warmup", 1*time.Second, "load before measuring (not counted)")
	maxReq := flag.Int64("requests", 2_000_000, "at most this many measured requests")
	label := flag.String("label", "", "copied into the output")
	flag.Parse()
	if *descs < 1 || *descs > 8 || *conc < 1 || *conns < 1 || *keys < 1 {
		fmt.Fprintln(os.Stderr, "rlsload: descriptors 1..8, concurrency, conns and keys at least 1")
		os.Exit(2)
	}

	target := *addr
	var dialer func(context.Context, string) (net.Conn, error)
	if strings.HasPrefix(target, "unix:") {
		path := strings.TrimPrefix(target, "unix:")
		dialer = func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		target = "passthrough:///uds"
	} else {
		target = "passthrough:///" + target
	}
	clients := make([]rls.RateLimitServiceClient, *conns)
	for i := range clients {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if dialer != nil {
			opts = append(opts, grpc.WithContextDialer(dialer))
		}
		cc, err := grpc.NewClient(target, opts...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rlsload: dial:", err)
			os.Exit(1)
		}
		defer cc.Close()
		clients[i] = rls.NewRateLimitServiceClient(cc)
	}

	var measuring atomic.Bool
	var stop atomic.Bool
	var issued atomic.Int64
	var ok, over, errs atomic.Int64
	var firstErr atomic.Value
	lat := make([][]int64, *conc)
	var wg sync.WaitGroup
	for w := 0; w < *conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w) + 1))
			c := clients[w%len(clients)]
			mine := make([]int64, 0, 1<<16)
			for !stop.Load() {
				req := &rls.RateLimitRequest{Domain: *domain, HitsAddend: 1}
				for i := 0; i < *descs; i++ {
					req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
						Entries: []*rlcommon.RateLimitDescriptor_Entry{{
							Key: fmt.Sprintf("d%d", i), Value: fmt.Sprintf("k%d", r.Intn(*keys)),
						}},
					})
				}
				counted := measuring.Load()
				if counted && issued.Add(1) > *maxReq {
					return
				}
				t0 := time.Now()
				resp, err := c.ShouldRateLimit(context.Background(), req)
				us := time.Since(t0).Microseconds()
				if !counted {
					continue
				}
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
					mine = append(mine, us)
				default:
					ok.Add(1)
					mine = append(mine, us)
				}
			}
			lat[w] = mine
		}(w)
	}
	time.Sleep(*warm)
	cpu0 := cpuMicros()
	t0 := time.Now()
	measuring.Store(true)
	time.Sleep(*dur)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(t0).Seconds()
	cpu := cpuMicros() - cpu0

	var all []int64
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) int64 {
		if len(all) == 0 {
			return 0
		}
		return all[int(p*float64(len(all)-1))]
	}
	n := ok.Load() + over.Load()
	out := map[string]any{
		"label": *label, "descriptors": *descs, "concurrency": *conc, "conns": *conns,
		"keys": *keys, "seconds": elapsed, "decisions": n, "ok": ok.Load(),
		"over_limit": over.Load(), "errors": errs.Load(),
		"decisions_per_sec": float64(n) / elapsed,
		"p50_us":            pct(0.50), "p99_us": pct(0.99), "max_us": pct(1.0),
		"client_cpu_us": cpu,
	}
	if e := firstErr.Load(); e != nil {
		out["first_error"] = e
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
