package shardlimit

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// Which rules take a lease follows the config in force: after a reload makes the
// middleware's policy a concurrency limit, requests acquire it and give it back when
// they end (they got 503: the policy was still checked, an invalid_argument error), and
// after a reload that makes it a window again, they are checked again.
func TestMiddlewareFollowsAReloadToAndFromConcurrency(t *testing.T) {
	window := `{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`
	l, err := NewFromJSON(window)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// the handler holds the request while a slow handler is installed
	var slow atomic.Pointer[slowHandler]
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s := slow.Load(); s != nil {
			s.ServeHTTP(w, r)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	// built before any reload, and used across them
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	h := Middleware(MiddlewareOptions{Limiter: l, Rules: []Rule{{Policy: "api", Key: user}}}, next)
	u1 := map[string]string{"X-User": "u1"}
	if c := serve(h, "/", u1).Code; c != http.StatusOK {
		t.Fatalf("first request on the window: %d", c)
	}
	if c := serve(h, "/", u1).Code; c != http.StatusTooManyRequests {
		t.Fatalf("second request on a window of 1: %d", c)
	}

	if err := l.Reload(`{"policies":{"api":{"algorithm":"concurrency","max":1,"lease_ttl":"30s"}}}`); err != nil {
		t.Fatal(err)
	}
	s := newSlow()
	slow.Store(s)
	first := make(chan int, 1)
	go func() { first <- serve(h, "/", u1).Code }()
	select {
	case <-s.entered: // holds the one lease
	case c := <-first:
		t.Fatalf("the first request on the concurrency limit: %d, want it held in the handler", c)
	case <-time.After(5 * time.Second):
		t.Fatal("the first request on the concurrency limit never reached the handler")
	}
	if c := serve(h, "/", u1).Code; c != http.StatusTooManyRequests {
		t.Fatalf("a second request while the one lease is held: %d, want 429", c)
	}
	close(s.release)
	if c := <-first; c != http.StatusOK {
		t.Fatalf("the request holding the lease: %d, want 200", c)
	}
	slow.Store(nil)
	// its lease came back when it ended: the next two, one after the other, pass
	for i := 0; i < 2; i++ {
		if c := serve(h, "/", u1).Code; c != http.StatusOK {
			t.Fatalf("sequential request %d on the concurrency limit: %d, want 200", i, c)
		}
	}

	if err := l.Reload(window); err != nil {
		t.Fatal(err)
	}
	// another key: u1's window of the first part still counts its request
	u2 := map[string]string{"X-User": "u2"}
	if c := serve(h, "/", u2).Code; c != http.StatusOK {
		t.Fatalf("first request on the window again: %d", c)
	}
	if c := serve(h, "/", u2).Code; c != http.StatusTooManyRequests {
		t.Fatalf("second request on the window again: %d, want 429 (checked, not acquired)", c)
	}
	if g, err := l.ConfigGeneration(); err != nil || g != 2 {
		t.Fatalf("ConfigGeneration after two reloads: %d %v", g, err)
	}
}

// What the middleware adds per request to follow reloads: one ConfigGeneration call
// (the set itself is read again only after a reload).
func BenchmarkMiddlewareConcurrencySet(b *testing.B) {
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	c := &concurrencyCache{l: l}
	for i := 0; i < b.N; i++ {
		if _, err := c.get(); err != nil {
			b.Fatal(err)
		}
	}
}
