package shardlimit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Killed, then restarted on its port after an outage long enough (1.5 s, a check every
// 10 ms) that the circuit is open and every back-off at its longest: the host transport
// decides on Redis again within 500 ms, counted from before the new server is spawned
// (its own start-up is in it).
func TestHostRedisUsedAgainWithin500msOfARestart(t *testing.T) {
	r := startRedis(t)
	l := hostLimiter(t, r, 300, `"api":{"algorithm":"fixed_window","limit":100,"window":"1h","on_error":"open"}`)
	untilRedisDecides(t, l, "k", "api")
	ctx := context.Background()
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // (its waiter reaps it)
	outage := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(outage) {
		d, err := l.Check(ctx, "k", "api", 1)
		if err != nil || d.Source != SourceFallback {
			t.Fatalf("during the outage: %+v %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	spawned := time.Now()
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(r.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", os.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	until := spawned.Add(5 * time.Second)
	for {
		d, err := l.Check(ctx, "fresh", "api", 1)
		if err == nil && d.Source == SourceRedis {
			if d.Remaining != 99 {
				t.Fatalf("first decision from Redis: %+v", d)
			}
			break
		}
		if time.Now().After(until) {
			t.Fatal("never reconnected after a restart")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("Redis used again %v after the restart", time.Since(spawned).Round(time.Millisecond))
	if took := time.Since(spawned); took >= 500*time.Millisecond {
		t.Fatalf("Redis was used again %v after its restart (the promise: under 500 ms)", took)
	}
}

// Many goroutines on one key, Redis healthy, the default timeout (50 ms) and on_error
// (open): exactly the limit is admitted and nothing falls back, on the host and the
// thread transport. scripts/test-overload.sh runs it with every CPU busy
// (SHARDLIMIT_OVERLOAD=1); `go test` alone runs a smaller round of it.
func TestOverloadManyGoroutinesOneKey(t *testing.T) {
	goroutines, each := 200, 10
	if os.Getenv("SHARDLIMIT_OVERLOAD") != "" {
		goroutines, each = 2000, 10
	}
	r := startRedis(t)
	for _, transport := range []Transport{TransportHost, TransportThread} {
		cfg := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"key_prefix":"overload-%s:",
			"policies":{"hourly":{"algorithm":"fixed_window","limit":100,"window":"1h"}}}`, r.Port, transport)
		l, err := NewFromJSON(cfg, WithTransport(transport))
		if err != nil {
			t.Fatal(err)
		}
		var admitted, fallbacks, errs atomic.Int64
		var firstErr atomic.Value
		var wg sync.WaitGroup
		start := make(chan struct{})
		began := time.Now()
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < each; i++ {
					d, err := l.Check(context.Background(), "one-key", "hourly", 1)
					if err != nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					if d.Allowed {
						admitted.Add(1)
					}
					if d.Source != SourceRedis {
						fallbacks.Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		l.Close()
		line := fmt.Sprintf("go %d goroutines x %d checks, one key, %s transport: admitted %d of limit 100, fallbacks %d, errors %d (%v) %v",
			goroutines, each, transport, admitted.Load(), fallbacks.Load(), errs.Load(), firstErr.Load(), time.Since(began).Round(time.Millisecond))
		if admitted.Load() != 100 || fallbacks.Load() != 0 || errs.Load() != 0 {
			t.Error("FAIL " + line)
		} else {
			t.Log("ok   " + line)
		}
	}
}
