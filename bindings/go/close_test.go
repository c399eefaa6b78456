package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// The config-reload pattern: goroutines check through a limiter while it is
// closed and its successor (another limit) is created at once. Every call must return a
// decision of the limiter it was made on, or ErrClosed: never the successor's decision,
// never another error. With handles identified by address, the successor could be
// allocated where the old limiter was and answer for it.
func TestCloseWhileGoroutinesCheck(t *testing.T) {
	r := startRedis(t)
	oldConfig := r.config(`"api":{"algorithm":"fixed_window","limit":1000000,"window":"1h"}`)
	newConfig := r.config(`"api":{"algorithm":"fixed_window","limit":7,"window":"1h"}`)
	ctx := context.Background()
	const rounds, goroutines = 100, 4
	var raced atomic.Int64 // calls that reached the library after Close
	for round := 0; round < rounds; round++ {
		old, err := NewFromJSON(oldConfig)
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for closed := 0; closed < 50; {
					d, err := old.Check(ctx, "k", "api", 1)
					switch {
					case err == nil && closed > 0:
						errs <- errors.New("a decision after ErrClosed")
						return
					case err == nil && d.Limit != 1000000:
						errs <- fmt.Errorf("another limiter's decision: limit %d", d.Limit)
						return
					case err == nil:
						calls.Add(1)
					case errors.Is(err, ErrClosed):
						var e *Error
						if errors.As(err, &e) && e.Message != "" {
							raced.Add(1) // the C library said CLOSED, not the wrapper
						}
						closed++
					default:
						errs <- err
						return
					}
				}
			}()
		}
		for calls.Load() < goroutines*3 {
			runtime.Gosched()
		}
		if err := old.Close(); err != nil {
			t.Fatal(err)
		}
		next, err := NewFromJSON(newConfig)
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC() // the collector scans the goroutines' handles: they are not Go pointers
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		d, err := next.Check(ctx, "k", "api", 1)
		if err != nil || d.Limit != 7 {
			t.Fatalf("round %d: successor: %+v %v", round, d, err)
		}
		next.Close()
	}
	t.Logf("%d calls reached the library after Close and got CLOSED", raced.Load())
}

// The same race made deterministic: Close, and the successor's creation, land between a
// call's load of the handle and the library's use of it, so the call reaches the library
// with a freed handle every time. It must get CLOSED from the library, not
// INVALID_ARGUMENT, and never a decision of the successor (limit 7), which an allocator
// is likely to place at the freed address.
func TestCallRacingCloseGetsClosedFromTheLibrary(t *testing.T) {
	r := startRedis(t)
	oldConfig := r.config(`"api":{"algorithm":"fixed_window","limit":1000000,"window":"1h"}`)
	newConfig := r.config(`"api":{"algorithm":"fixed_window","limit":7,"window":"1h"}`)
	ctx := context.Background()
	for round := 0; round < 20; round++ {
		old, err := NewFromJSON(oldConfig)
		if err != nil {
			t.Fatal(err)
		}
		var next *Limiter
		old.afterOpen = func() {
			old.afterOpen = nil
			old.Close()
			if next, err = NewFromJSON(newConfig); err != nil {
				t.Fatal(err)
			}
		}
		d, err := old.Check(ctx, "k", "api", 1)
		var e *Error
		if !errors.Is(err, ErrClosed) || !errors.As(err, &e) || e.Message == "" {
			t.Fatalf("round %d: want CLOSED from the library, got %+v, %v", round, d, err)
		}
		if d, err := next.Check(ctx, "k", "api", 1); err != nil || d.Limit != 7 {
			t.Fatalf("round %d: successor: %+v %v", round, d, err)
		}
		next.Close()
	}
}
