package shardlimit

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"
)

// A caller that goes away while Acquire is in flight gets context.Canceled, and the
// lease Redis grants afterwards is released when the call completes: the lease count is
// back to 0 (it stayed 1 until lease_ttl, 30 s, when the call was cancelled instead).
func TestAcquireAbandonedMidCallReleasesItsLease(t *testing.T) {
	l, r := concLimiter(t)
	ctx := context.Background()
	// connected, scripts loaded
	d, lease, err := l.Acquire(ctx, "u1", "one", 1)
	if err != nil || !d.Allowed || lease == nil {
		t.Fatalf("warm-up: %+v %v %v", d, lease, err)
	}
	if _, err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{}, 1)
	l.afterAbandoned = func() { released <- struct{}{} }
	// Redis stopped: the call is in flight and cannot complete before the caller goes
	r.stop(t)
	callCtx, cancel := context.WithCancel(ctx)
	// left set (cancelling again is a no-op): the release goroutine reads it too
	l.afterStart = cancel
	_, lease, err = l.Acquire(callCtx, "u1", "one", 1)
	if !errors.Is(err, context.Canceled) || lease != nil {
		t.Fatalf("Acquire: %v %v, want context.Canceled and no lease", lease, err)
	}
	// Redis answers again: the script runs and grants the lease, which goes back
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatalf("the abandoned Acquire's lease was never given back (%s held in Redis)", held(t, r, "one", "u1"))
	}
	if n := held(t, r, "one", "u1"); n != ":0" {
		t.Fatalf("%s leases held in Redis after the abandoned Acquire, want 0", n)
	}
	d, lease, err = l.Acquire(ctx, "u1", "one", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("the one unit is not free again: %+v %v", d, err)
	}
	_, _ = lease.Release(ctx)
}

// The same with a caller whose ctx deadline passes (not a cancel): ctx.Done() fires for
// both, so the lease Redis grants afterwards goes back too.
func TestAcquireWhoseDeadlinePassesReleasesItsLease(t *testing.T) {
	l, r := concLimiter(t)
	ctx := context.Background()
	d, lease, err := l.Acquire(ctx, "u2", "one", 1)
	if err != nil || !d.Allowed || lease == nil {
		t.Fatalf("warm-up: %+v %v %v", d, lease, err)
	}
	if _, err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{}, 1)
	l.afterAbandoned = func() { released <- struct{}{} }
	r.stop(t)
	// Redis is stopped: the call cannot complete before the deadline
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	_, lease, err = l.Acquire(callCtx, "u2", "one", 1)
	if !errors.Is(err, context.DeadlineExceeded) || lease != nil {
		t.Fatalf("Acquire: %v %v, want context.DeadlineExceeded and no lease", lease, err)
	}
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatalf("the Acquire's lease was never given back (%s held in Redis)", held(t, r, "one", "u2"))
	}
	if n := held(t, r, "one", "u2"); n != ":0" {
		t.Fatalf("%s leases held in Redis after the Acquire whose deadline passed, want 0", n)
	}
}
