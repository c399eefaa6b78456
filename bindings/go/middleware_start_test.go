package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// redisCmd sends one command to redis-server on port (RESP) and returns its reply's
// first line ("+OK", ":0", "$3"...).
func redisCmd(t *testing.T, port int, args ...string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	c, r, err := rawRedis(port, 2*time.Second, b.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(line, "\r\n")
}

// NewMiddleware connects and loads the scripts before it returns, so the first burst is
// decided by Redis: 64 concurrent requests against a limit of 50 admit exactly 50 (with
// on_error "open", a request whose deadline went on connecting would be admitted too).
func TestNewMiddlewareConnectsBeforeServing(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":1000,
		"policies":{"api":{"algorithm":"fixed_window","limit":50,"window":"1h","on_error":"open"}}}`, r.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := info(t, r.Port, "memory", "number_of_cached_scripts"); got != "0" {
		t.Fatalf("scripts before NewMiddleware: %s", got)
	}
	mw, err := NewMiddleware(context.Background(), MiddlewareOptions{Limiter: l, Policy: "api"})
	if err != nil {
		t.Fatal(err)
	}
	// connected before any request
	if got := info(t, r.Port, "memory", "number_of_cached_scripts"); got == "0" {
		t.Fatal("NewMiddleware returned before the scripts were loaded")
	}
	if got := info(t, r.Port, "clients", "connected_clients"); got == "0" {
		t.Fatal("NewMiddleware returned with no connection")
	}
	h := mw(ok)
	const n = 64
	codes := make([]int, n)
	sources := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			rec := serve(h, "/", nil)
			codes[i], sources[i] = rec.Code, rec.Header().Get("X-Source")
		}()
	}
	close(start)
	wg.Wait()
	admitted := 0
	for i, c := range codes {
		switch c {
		case http.StatusOK:
			admitted++
			if sources[i] != "redis" {
				t.Errorf("request %d admitted by %q, not redis", i, sources[i])
			}
		case http.StatusTooManyRequests:
		default:
			t.Errorf("request %d: %d", i, c)
		}
	}
	if admitted != 50 {
		t.Fatalf("%d of %d admitted against a limit of 50", admitted, n)
	}
}

// Against a closed port NewMiddleware returns an error naming the shard, instead of a
// middleware that would serve on_error's fallbacks silently; bad options are errors too.
func TestNewMiddlewareRefusesAnUnreachableShard(t *testing.T) {
	port := freePort(t) // nothing listens there
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"edge-7","url":"redis://127.0.0.1:%d"}],"timeout_ms":50,
		"policies":{"api":{"algorithm":"fixed_window","limit":50,"window":"1h","on_error":"open"}}}`, port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t0 := time.Now()
	mw, err := NewMiddleware(context.Background(), MiddlewareOptions{Limiter: l, Policy: "api", ConnectTimeout: 500 * time.Millisecond})
	if err == nil || mw != nil {
		t.Fatal("NewMiddleware served against a closed port")
	}
	if !strings.Contains(err.Error(), "edge-7") || !errors.Is(err, ErrConnection) && !errors.Is(err, ErrTimeout) {
		t.Fatalf("error %v: want a connection error naming the shard edge-7", err)
	}
	if e := time.Since(t0); e > 3*time.Second {
		t.Fatalf("NewMiddleware took %v with a 500 ms ConnectTimeout", e)
	}
	t.Logf("closed port: %v", err)
	// ctx bounds it as well
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewMiddleware(ctx, MiddlewareOptions{Limiter: l, Policy: "api"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled ctx: %v", err)
	}
	// mistakes in the options are errors, not panics, and nothing is connected for them
	if _, err := NewMiddleware(context.Background(), MiddlewareOptions{Limiter: l, Policy: "nope"}); !errors.Is(err, ErrUnknownPolicy) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := NewMiddleware(context.Background(), MiddlewareOptions{Policy: "api"}); err == nil {
		t.Fatal("no limiter: no error")
	}
	if _, err := NewMiddleware(context.Background(), MiddlewareOptions{Limiter: l, Policy: "api", ConnectTimeout: -time.Second}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative ConnectTimeout: %v", err)
	}
	// in memory there is nothing to connect
	m, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mw, err = NewMiddleware(context.Background(), MiddlewareOptions{Limiter: m, Policy: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if rec := serve(mw(ok), "/", nil); rec.Code != 200 {
		t.Fatalf("in memory: %d", rec.Code)
	}
}
