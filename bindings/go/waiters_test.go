package shardlimit

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

// parked counts the goroutines whose stack holds frame and that are parked on a channel
// (a select or a receive), not in a cgo call.
func parked(frame string) int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, frame) && (strings.Contains(header, "[select") || strings.Contains(header, "[chan receive")) {
			n++
		}
	}
	return n
}

// waitParked waits (at most 10 s: readiness, not a race) until n goroutines with frame are
// parked on a channel. A goroutine blocked in the library (a cgo call) never is.
func waitParked(t *testing.T, frame string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for parked(frame) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of %s parked on a channel, want %d (are they blocked in a cgo call?)", parked(frame), frame, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// 50 subscriptions add no OS thread: each reader parks on a channel, woken through the
// completion queue when its subscription has events (one thread per reader, blocked in
// shardlimit_subscription_next, was 50 more). Each still gets every event.
func TestSubscriptionsHoldNoThread(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// the completion queue's goroutine and the library's threads exist before the baseline
	first, err := l.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitParked(t, "Subscribe.func", 1)
	before := osThreads(t)
	subs := []<-chan Event{first}
	for i := 1; i < 50; i++ {
		ch, err := l.Subscribe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, ch)
	}
	waitParked(t, "Subscribe.func", 50)
	during := osThreads(t)
	t.Logf("OS threads: %d with one subscription, %d with 50", before, during)
	if during > before+8 {
		t.Fatalf("%d OS threads with 50 subscriptions, %d with one", during, before)
	}
	// a denial reaches every subscription
	for i := 0; i < 2; i++ {
		if _, err := l.Check(ctx, "k", "api", 1); err != nil {
			t.Fatal(err)
		}
	}
	for i, ch := range subs {
		for denied := false; !denied; {
			select {
			case ev := <-ch:
				// the first check's near_limit event comes before it
				denied = ev.Kind == EventDenied && ev.Key == "k"
			case <-time.After(5 * time.Second):
				t.Fatalf("subscription %d: no denial", i)
			}
		}
	}
	// and ends with its context
	cancel()
	for i, ch := range subs {
		select {
		case _, open := <-ch:
			if open {
				t.Fatalf("subscription %d: an event after its context ended", i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("subscription %d: not closed with its context", i)
		}
	}
}

// A subscription's channel closes when the limiter does (the library notifies its reader).
func TestSubscriptionClosesWithTheLimiter(t *testing.T) {
	l, err := NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := l.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	waitParked(t, "Subscribe.func", 1)
	_ = l.Close()
	select {
	case _, open := <-ch:
		if open {
			t.Fatal("an event, want the channel closed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the channel stayed open after Close")
	}
}

// The warning lines' goroutine of each limiter parks on a channel too: 50 limiters add no
// OS thread for their logs (it was one each, blocked in shardlimit_log_subscription_next).
func TestLogDrainsHoldNoThread(t *testing.T) {
	// at least: other tests' limiters' drains may still be parked, or ending
	warm, err := NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()
	waitParked(t, "forwardLogs", 1)
	before := osThreads(t)
	for i := 0; i < 50; i++ {
		l, err := NewMemory()
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	waitParked(t, "forwardLogs", 51)
	during := osThreads(t)
	t.Logf("OS threads: %d with one limiter, %d with 51", before, during)
	if during > before+8 {
		t.Fatalf("%d OS threads with 51 limiters' log drains, %d with one", during, before)
	}
}
