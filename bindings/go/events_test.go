package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// next is the next event on ch within 10 s.
func next(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the event channel closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10 s")
	}
	return Event{}
}

// closed waits (at most 10 s) for ch to close, draining it.
func closed(t *testing.T, ch <-chan Event) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the event channel did not close")
		}
	}
}

// goroutinesBack waits (at most 10 s) until the goroutine count is at most n: the
// subscription's goroutines end after their channel closes, not before.
func goroutinesBack(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// Events from Go, on Redis: a near-limit crossing, a denial, a block; the channel closes
// when ctx is done and when the limiter closes, and no goroutine stays behind.
func TestSubscribeDeliversEventsAndCloses(t *testing.T) {
	s := startRedis(t)
	l, err := NewFromJSON(s.config(`"ev":{"algorithm":"fixed_window","limit":4,"window":"1h","near_limit":0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// a first call: the library's I/O thread then has the goroutine cgo keeps for the C
	// thread that calls back into Go
	if _, err := l.Check(context.Background(), "warm", "ev", 1); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	events, err := l.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	for i := 0; i < 5; i++ {
		if _, err := l.Check(bg, "k1", "ev", 1); err != nil {
			t.Fatal(err)
		}
	}
	ev := next(t, events)
	if ev.Kind != EventNearLimit || ev.Kind.String() != "near_limit" || ev.Policy != "ev" || ev.Key != "k1" ||
		ev.Limit != 4 || ev.Remaining != 2 || ev.Decision != nil {
		t.Fatalf("near limit: %+v", ev)
	}
	ev = next(t, events)
	if ev.Kind != EventDenied || ev.Key != "k1" || ev.Decision == nil || ev.Decision.Allowed ||
		ev.Decision.Limit != 4 || !ev.HasRetryAfter || ev.RetryAfter <= 0 {
		t.Fatalf("denied: %+v", ev)
	}
	if err := l.Block(bg, "k2", time.Minute, "abuse"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Check(bg, "k2", "ev", 1); err != nil || d.Allowed || d.Source != SourceBlock {
		t.Fatalf("blocked: %+v %v", d, err)
	}
	if ev = next(t, events); ev.Kind != EventBlocked || ev.Key != "k2" || ev.AutoBlock {
		t.Fatalf("blocked: %+v", ev)
	}
	// ctx done: the channel closes and both goroutines end
	cancel()
	closed(t, events)
	goroutinesBack(t, base)
	if _, err := l.Subscribe(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("subscribe with a done ctx: %v", err)
	}
	// subscriptions come and go without leaving goroutines or OS threads behind
	threads := osThreads(t)
	for i := 0; i < 50; i++ {
		c, stop := context.WithCancel(bg)
		ch, err := l.Subscribe(c)
		if err != nil {
			t.Fatal(err)
		}
		stop()
		closed(t, ch)
	}
	goroutinesBack(t, base)
	if now := osThreads(t); now > threads+4 {
		t.Fatalf("50 subscriptions left %d OS threads behind (%d -> %d)", now-threads, threads, now)
	}

	// the limiter closed: the channel closes too, even with a ctx that never ends
	events, err = l.Subscribe(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Reload(s.config(`"ev":{"algorithm":"fixed_window","limit":9,"window":"1h"}`)); err != nil {
		t.Fatal(err)
	}
	if ev = next(t, events); ev.Kind != EventReloaded || ev.Detail != "ev" || ev.EngineChanged {
		t.Fatalf("reloaded: %+v", ev)
	}
	_ = l.Close()
	closed(t, events)
	goroutinesBack(t, base)
	if _, err := l.Subscribe(bg); !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribe after Close: %v", err)
	}
}

// WatchConfig: a change of the file is a reload (waited for as its event, not slept
// on), after which checks use the new limit; a bad file is refused and reported.
func TestWatchConfigReloadsOnChange(t *testing.T) {
	s := startRedis(t)
	path := filepath.Join(t.TempDir(), "shardlimit.json")
	// a modification time of its own (seen whatever the file system's resolution), and
	// the file replaced whole (written and dated aside, then renamed): seen once
	write := func(text string, secs int64) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		at := time.Unix(secs, 0)
		if err := os.Chtimes(tmp, at, at); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	policy := func(limit int) string {
		return s.config(fmt.Sprintf(`"w":{"algorithm":"fixed_window","limit":%d,"window":"1h"}`, limit))
	}
	write(policy(2), 1_000_000)
	l, err := NewFromConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	events, err := l.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.WatchConfig(ctx, path, -time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative interval: %v", err)
	}
	wctx, stop := context.WithCancel(ctx)
	w, err := l.WatchConfig(wctx, path, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Check(ctx, "k", "w", 1); d.Limit != 2 {
		t.Fatalf("%+v", d)
	}
	write(policy(7), 2_000_000)
	if ev := next(t, events); ev.Kind != EventReloaded || ev.Detail != "w" {
		t.Fatalf("reloaded: %+v", ev)
	}
	if d, _ := l.Check(ctx, "k", "w", 1); d.Limit != 7 {
		t.Fatalf("after the reload: %+v", d)
	}
	c, err := l.Config()
	if err != nil || c.Engine != "redis" || len(c.Policies) != 1 || c.Policies[0].Name != "w" ||
		c.Policies[0].Limits[0].Limit != 7 || c.Policies[0].Limits[0].Window != time.Hour ||
		c.Timeout != 2*time.Second || len(c.Shards) != 1 || c.Shards[0] != "s0" {
		t.Fatalf("config: %+v %v", c, err)
	}
	write("{ not json", 3_000_000)
	if ev := next(t, events); ev.Kind != EventReloadRejected || ev.ErrorCode != CodeConfig || ev.Detail == "" {
		t.Fatalf("rejected: %+v", ev)
	}
	// ctx done: the watcher stops (Close after it is a no-op)
	stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		stopped := w.w == nil
		w.mu.Unlock()
		if stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not stop with its ctx")
		}
		time.Sleep(time.Millisecond)
	}
	_ = w.Close()
	// stopped: a change of the file is no reload any more (10 intervals of the watcher)
	write(policy(9), 4_000_000)
	select {
	case ev := <-events:
		t.Fatalf("an event after the watcher stopped: %+v", ev)
	case <-time.After(50 * time.Millisecond):
	}
	if d, _ := l.Check(ctx, "k", "w", 1); d.Limit != 7 {
		t.Fatalf("%+v", d)
	}
}

// Policy.WithShadow and the middleware's Shadow option run an enforcing policy in shadow.
func TestPolicyWithShadowAndShadowMiddleware(t *testing.T) {
	l, err := NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := NewPolicy("adhoc", Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sp, err := p.WithShadow(true)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	ctx := context.Background()
	for i, want := range []bool{false, true} {
		d, err := l.CheckPolicy(ctx, "k", sp, 1)
		if err != nil || !d.Allowed || d.ShadowDenied != want {
			t.Fatalf("shadow check %d: %+v %v", i, d, err)
		}
	}
	if d, _ := l.CheckPolicy(ctx, "k", p, 1); d.Allowed || d.ShadowDenied {
		t.Fatalf("the original enforces: %+v", d)
	}
	cp, _ := NewPolicy("conc", Limit{Algorithm: Concurrency, Limit: 1, Period: time.Second})
	defer cp.Close()
	if _, err := cp.WithShadow(true); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("concurrency in shadow: %v", err)
	}

	ml, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Close()
	var seen []bool
	h := Middleware(MiddlewareOptions{Limiter: ml, Policy: "api", Shadow: true,
		Key: func(*http.Request) string { return "client" }},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := DecisionFrom(r.Context())
			seen = append(seen, d.ShadowDenied)
		}))
	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}
	if len(seen) != 3 || seen[0] || !seen[1] || !seen[2] {
		t.Fatalf("shadow denials seen by the handler: %v", seen)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Shadow with layered rules did not panic at construction")
		}
	}()
	Middleware(MiddlewareOptions{Limiter: ml, Shadow: true, Rules: []Rule{{Policy: "api"}, {Policy: "api"}}}, nil)
}
