package shardlimit

import (
	"context"
	"fmt"
	"testing"
)

// The README's pattern during an outage: under on_error "open" a fallback allows the
// Acquire, and `if lease == nil { busy }` must not refuse everyone. The lease is a no-op
// one: nothing is held in Redis, Release gives nothing back and is not an error.
func TestAcquireAllowedByAFallbackReturnsANoopLease(t *testing.T) {
	l, err := NewFromJSON(fmt.Sprintf(`{"timeout_ms": 300,
		"shards": [{"name": "dead", "url": "redis://127.0.0.1:%d"}],
		"policies": {"reports": {"algorithm": "concurrency", "max": 1, "lease_ttl": "30s", "on_error": "open"}}}`, freePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	d, lease, err := l.Acquire(ctx, "tenant:7", "reports", 1)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("want an allowance by the fallback, got %+v", d)
	}
	if lease == nil {
		t.Fatal("a fallback allowed the Acquire but returned no lease: `if lease == nil { busy }` refuses everyone during an outage")
	}
	if lease.Held() {
		t.Fatal("a fallback's lease says it holds units in Redis")
	}
	released, err := lease.Release(ctx)
	if err != nil || released {
		t.Fatalf("Release of a fallback's lease: %v %v, want false, nil", released, err)
	}
}

// `defer lease.Release(r.Context())` runs after the client went away: the request's
// context is cancelled by then. The units must go back now, not after the lease TTL.
func TestReleaseWithACancelledContextGivesTheUnitsBack(t *testing.T) {
	l, r := concLimiter(t)
	ctx := context.Background()
	d, lease, err := l.Acquire(ctx, "u1", "one", 1)
	if err != nil || !d.Allowed || lease == nil || !lease.Held() {
		t.Fatalf("Acquire: %+v %v %v", d, lease, err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	cancel() // the client has gone
	released, err := lease.Release(reqCtx)
	if err != nil || !released {
		t.Fatalf("Release(cancelled ctx): %v %v, want true, nil", released, err)
	}
	if n := held(t, r, "one", "u1"); n != ":0" {
		t.Fatalf("%s leases held in Redis after Release, want 0", n)
	}
	if lease.Held() {
		t.Fatal("a released lease says it is held")
	}
}
