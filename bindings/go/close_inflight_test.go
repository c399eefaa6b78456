package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Close with checks in flight lets them finish, as documented: each gets Redis's
// decision (on_error "error": an error would say otherwise), Close returns after them,
// later checks get ErrClosed, and no goroutine is left. Redis is stopped while the
// checks are sent, and continued only once Close is waiting, so every check is in flight
// when Close begins. On both transports.
func TestCloseLetsChecksInFlightFinish(t *testing.T) {
	for _, transport := range []Transport{TransportHost, TransportThread} {
		t.Run(string(transport), func(t *testing.T) {
			base := runtime.NumGoroutine()
			r := startRedis(t)
			cfg := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":5000,"policies":{
				"strict":{"algorithm":"fixed_window","limit":10,"window":"1h","on_error":"error"}}}`, r.Port)
			l, err := NewFromJSON(cfg, WithTransport(transport))
			if err != nil {
				t.Fatal(err)
			}
			untilRedisDecides(t, l, "k", "strict")
			var started atomic.Int64
			l.afterStart = func() { started.Add(1) }
			if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = r.cmd.Process.Signal(syscall.SIGCONT) }()
			type result struct {
				d   Decision
				err error
			}
			results := make(chan result, 8)
			for i := 0; i < 8; i++ {
				go func() {
					d, err := l.Check(context.Background(), "k", "strict", 1)
					results <- result{d, err}
				}()
			}
			waitFor(t, "8 checks in flight", func() bool { return started.Load() == 8 })
			closed := make(chan struct{})
			go func() {
				l.Close()
				close(closed)
			}()
			// Close is waiting on the checks (they cannot end: Redis is stopped)
			waitFor(t, "Close waiting", func() bool { return l.h.Load() == nil })
			select {
			case <-closed:
				t.Fatal("Close returned with 8 checks in flight")
			case res := <-results:
				t.Fatalf("a check ended before Redis answered: %+v %v", res.d, res.err)
			case <-time.After(100 * time.Millisecond):
			}
			if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			allowed := 0
			for i := 0; i < 8; i++ {
				res := <-results
				if res.err != nil {
					t.Fatalf("a check in flight at Close failed: %v", res.err)
				}
				if res.d.Source != SourceRedis {
					t.Fatalf("a check in flight at Close was decided by %v", res.d.Source)
				}
				if res.d.Allowed {
					allowed++
				}
			}
			if allowed != 8 {
				t.Fatalf("%d of 8 allowed, want 8 (limit 10, 1 used)", allowed)
			}
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return once the checks finished")
			}
			if _, err := l.Check(context.Background(), "k", "strict", 1); !errors.Is(err, ErrClosed) {
				t.Fatalf("after Close: %v", err)
			}
			goroutinesBack(t, base+2)
		})
	}
}
