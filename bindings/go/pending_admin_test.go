package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// stalledAdminLimiter is a stalled limiter (stalledLimiterWith) with a policy that takes
// overrides and one in shadow, every admin call answered once before Redis stops.
func stalledAdminLimiter(t *testing.T) *Limiter {
	t.Helper()
	policies := `{"ov":{"algorithm":"fixed_window","limit":5,"window":"1h","overrides":true,"on_error":"error"},
		"sh":{"algorithm":"fixed_window","limit":1,"window":"1h","shadow":true,"on_error":"error"}}`
	return stalledLimiterWith(t, policies, func(ctx context.Context, l *Limiter) error {
		if err := l.Connect(ctx, 5*time.Second); err != nil {
			return err
		}
		if _, err := l.SetOverride(ctx, "warm", "ov", "9/hour", time.Minute); err != nil {
			return err
		}
		if o, err := l.GetOverride(ctx, "warm", "ov"); err != nil || o == nil {
			return fmt.Errorf("get: %+v %v", o, err)
		}
		if _, err := l.ListOverrides(ctx, "ov", "", 10); err != nil {
			return err
		}
		if had, err := l.DeleteOverride(ctx, "warm", "ov"); err != nil || !had {
			return fmt.Errorf("delete: %v %v", had, err)
		}
		_, err := l.ShadowReport(ctx, "sh", 0)
		return err
	})
}

// adminCalls are the Limiter's calls besides checks that wait for Redis.
func adminCalls(l *Limiter) map[string]func(ctx context.Context) error {
	return map[string]func(ctx context.Context) error{
		"SetOverride": func(ctx context.Context) error {
			_, err := l.SetOverride(ctx, "k", "ov", "10/minute", time.Minute)
			return err
		},
		"GetOverride":    func(ctx context.Context) error { _, err := l.GetOverride(ctx, "k", "ov"); return err },
		"DeleteOverride": func(ctx context.Context) error { _, err := l.DeleteOverride(ctx, "k", "ov"); return err },
		"ListOverrides":  func(ctx context.Context) error { _, err := l.ListOverrides(ctx, "ov", "", 100); return err },
		"ShadowReport":   func(ctx context.Context) error { _, err := l.ShadowReport(ctx, "sh", 10); return err },
	}
}

// Each override call and the shadow report, against a stopped Redis, returns
// context.DeadlineExceeded right after a 20 ms deadline (they were blocking C calls that
// saw ctx only before the call, and returned after the config's deadline).
func TestAdminCallsDeadlineAgainstStoppedRedis(t *testing.T) {
	l := stalledAdminLimiter(t)
	for name, call := range adminCalls(l) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		t0 := time.Now()
		err := call(ctx)
		elapsed := time.Since(t0)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: err %v, want context.DeadlineExceeded", name, err)
			continue
		}
		t.Logf("%s: 20 ms deadline, returned after %v", name, elapsed)
		// a few ms past the deadline; the slack is for a loaded 2-CPU machine under -race,
		// far below the config's 10 s deadline that a blocking call would wait for
		if elapsed < 20*time.Millisecond || elapsed > 120*time.Millisecond {
			t.Errorf("%s: returned after %v", name, elapsed)
		}
	}
}

// Cancelling mid-call (once the call is in flight) returns context.Canceled.
func TestAdminCallsCancelMidCall(t *testing.T) {
	l := stalledAdminLimiter(t)
	cancelEachMidCall(t, l, adminCalls(l))
}

// 200 goroutines calling the override API against a stopped Redis hold no OS thread
// each: the process keeps GOMAXPROCS plus a small constant (a blocking call pinned one
// thread per call: 200 more).
func TestAdminCallsNoThreadPerCall(t *testing.T) {
	l := stalledAdminLimiter(t)
	const n = 200
	before := osThreads(t)
	finish := inFlight(t, l, n, func(ctx context.Context, i int) error {
		key := fmt.Sprintf("user:%d", i)
		var err error
		switch i % 4 {
		case 0:
			_, err = l.SetOverride(ctx, key, "ov", "10/minute", 0)
		case 1:
			_, err = l.GetOverride(ctx, key, "ov")
		case 2:
			_, err = l.DeleteOverride(ctx, key, "ov")
		default:
			_, err = l.ListOverrides(ctx, "ov", "", 10)
		}
		return err
	})
	during := osThreads(t)
	finish()
	fewThreads(t, before, during, n)
}

// The started override calls give the same answers as before, on the in-memory engine
// (where a started call completes inside its start) and their errors keep their kinds.
func TestAdminCallsInMemory(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"ov":{"algorithm":"fixed_window","limit":5,"window":"1h","overrides":true},
		"plain":{"algorithm":"fixed_window","limit":5,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	o, err := l.SetOverride(ctx, "acme", "ov", "100/hour", 0)
	if err != nil || o.Key != "acme" || o.Policy != "ov" || !o.Permanent {
		t.Fatalf("set: %+v %v", o, err)
	}
	if got, err := l.GetOverride(ctx, "acme", "ov"); err != nil || got == nil || string(got.Limit) != string(o.Limit) {
		t.Fatalf("get: %+v %v", got, err)
	}
	if got, err := l.GetOverride(ctx, "nobody", "ov"); err != nil || got != nil {
		t.Fatalf("get of a key without one: %+v %v", got, err)
	}
	if page, err := l.ListOverrides(ctx, "ov", "", 10); err != nil || len(page.Overrides) != 1 || page.Cursor != "" {
		t.Fatalf("list: %+v %v", page, err)
	}
	if had, err := l.DeleteOverride(ctx, "acme", "ov"); err != nil || !had {
		t.Fatalf("delete: %v %v", had, err)
	}
	if had, err := l.DeleteOverride(ctx, "acme", "ov"); err != nil || had {
		t.Fatalf("second delete: %v %v", had, err)
	}
	if _, err := l.SetOverride(ctx, "acme", "nope", "5/minute", 0); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := l.SetOverride(ctx, "acme", "plain", "5/minute", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a policy without overrides: %v", err)
	}
	if _, err := l.SetOverride(ctx, "acme", "ov", "gold", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a bad limit: %v", err)
	}
	if _, err := l.ShadowReport(ctx, "a:b", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a bad policy name: %v", err)
	}
	if r, err := l.ShadowReport(ctx, "ov", 0); err != nil || r.Policy != "ov" || r.Total != 0 {
		t.Fatalf("report: %+v %v", r, err)
	}
}
