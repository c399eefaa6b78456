// Package leaktest checks that the shardlimit package leaves no goroutine behind once
// every limiter is closed: goleak.VerifyNone passes in a user's test that touched one. A
// module of its own, so that the published module has no dependency on goleak.
package leaktest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	shardlimit "github.com/shardlimit/shardlimit/bindings/go"
	"go.uber.org/goleak"
)

// startRedis starts a redis-server on a free 127.0.0.1 port and stops it when the test
// ends.
func startRedis(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", os.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server must be installed: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return port
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start on port %d", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Every kind of limiter and call a service makes (Redis through the host transport and
// through the I/O thread, the in-memory engine, leases, subscriptions, warning lines),
// then Close: no goroutine of the package is left.
func TestNoGoroutineOutlivesTheLimiters(t *testing.T) {
	port := startRedis(t)
	ctx := context.Background()
	config := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,
		"policies":{"api":{"rate":"100/minute"},"conc":{"algorithm":"concurrency","max":2,"lease_ttl":"30s"}}}`, port)
	use := func(l *shardlimit.Limiter) {
		t.Helper()
		sub, err := l.Subscribe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = sub
		for i := 0; i < 3; i++ {
			if _, err := l.Check(ctx, "k", "api", 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, opts := range [][]shardlimit.Option{nil, {shardlimit.WithTransport(shardlimit.TransportThread)}} {
		l, err := shardlimit.NewFromJSON(config, opts...)
		if err != nil {
			t.Fatal(err)
		}
		use(l)
		d, lease, err := l.Acquire(ctx, "k", "conc", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("Acquire: %+v %v", d, err)
		}
		if _, err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := shardlimit.NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Check(ctx, "k", "none", 1); err == nil {
		t.Fatal("an unknown policy was checked")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t)
}
