package shardlimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// concLimiter is a limiter on a fresh redis-server with a concurrency policy "conc" (at
// most 2 in flight; leases live 30 s, so only a release frees one within a test) and a
// window "rate" of 3.
func concLimiter(t *testing.T) (*Limiter, *redisServer) {
	t.Helper()
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"conc":{"algorithm":"concurrency","max":2,"lease_ttl":"30s"},
		"one":{"algorithm":"concurrency","max":1,"lease_ttl":"30s"},
		"rate":{"algorithm":"fixed_window","limit":3,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, r
}

// held is the number of leases in Redis for key under policy (the members of its sorted
// set besides the "#" sum; the script deletes the set when nothing is held).
func held(t *testing.T, r *redisServer, policy, key string) string {
	t.Helper()
	return redisCmd(t, r.Port, "ZCOUNT", fmt.Sprintf("sl:s:%s:cc:{%s}", policy, key), "0", "+inf")
}

func keyU1(*http.Request) string { return "u1" }

// A handler that signals entry and waits for its release (or for the client to go).
type slowHandler struct {
	entered chan struct{}
	release chan struct{}
}

func newSlow() *slowHandler {
	return &slowHandler{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (s *slowHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-r.Context().Done():
		return
	}
	w.WriteHeader(http.StatusOK)
}

// With a concurrency limit of 2, two slow requests in flight make a third get 429; once
// they finish, a fourth is admitted; the leases in Redis are back to zero.
func TestMiddlewareConcurrencyLeases(t *testing.T) {
	l, r := concLimiter(t)
	slow := newSlow()
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "conc", Key: keyU1}, slow)
	codes := make(chan int, 2)
	for i := 0; i < 2; i++ {
		go func() { codes <- serve(h, "/", nil).Code }()
	}
	<-slow.entered
	<-slow.entered
	if got := held(t, r, "conc", "u1"); got != ":2" {
		t.Fatalf("leases with two in flight: %s", got)
	}
	third := serve(h, "/", nil)
	if third.Code != http.StatusTooManyRequests || third.Header().Get("Retry-After") == "" {
		t.Fatalf("third request: %d %v", third.Code, third.Header())
	}
	close(slow.release)
	for i := 0; i < 2; i++ {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("slow request: %d", c)
		}
	}
	if got := held(t, r, "conc", "u1"); got != ":0" {
		t.Fatalf("leases after both finished: %s", got)
	}
	fourth := serve(h, "/", nil)
	<-slow.entered
	if fourth.Code != http.StatusOK {
		t.Fatalf("fourth request: %d", fourth.Code)
	}
	if got := held(t, r, "conc", "u1"); got != ":0" {
		t.Fatalf("leases at the end: %s", got)
	}
}

// A handler that panics gives its lease back (the panic goes on to the server's
// recovery, here a recoverer in front of the middleware).
func TestMiddlewareConcurrencyReleasesOnPanic(t *testing.T) {
	l, r := concLimiter(t)
	var recovered []any
	var mu sync.Mutex
	recoverer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					mu.Lock()
					recovered = append(recovered, v)
					mu.Unlock()
					w.WriteHeader(http.StatusInternalServerError)
				}
			}()
			next.ServeHTTP(w, req)
		})
	}
	boom := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })
	h := recoverer(MiddlewareFunc(MiddlewareOptions{Limiter: l, Policy: "one", Key: keyU1})(boom))
	// more panics than the limit: each one's lease came back, or the second would be 429
	for i := 0; i < 3; i++ {
		if rec := serve(h, "/", nil); rec.Code != http.StatusInternalServerError {
			t.Fatalf("panic %d: %d", i, rec.Code)
		}
		if got := held(t, r, "one", "u1"); got != ":0" {
			t.Fatalf("leases after panic %d: %s", i, got)
		}
	}
	if len(recovered) != 3 || recovered[0] != "boom" {
		t.Fatalf("recovered %v: the panic must reach the server", recovered)
	}
}

// A client that goes away (its request's context cancelled) ends the handler, and the
// lease is given back although the request's context is done.
func TestMiddlewareConcurrencyReleasesWhenTheClientGoes(t *testing.T) {
	l, r := concLimiter(t)
	slow := newSlow()
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "one", Key: keyU1}, slow)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-slow.entered
	if got := held(t, r, "one", "u1"); got != ":1" {
		t.Fatalf("leases in flight: %s", got)
	}
	if rec := serve(h, "/", nil); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second request while one is in flight: %d", rec.Code)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not end with its client")
	}
	if got := held(t, r, "one", "u1"); got != ":0" {
		t.Fatalf("leases after the client went: %s", got)
	}
	close(slow.release)
	if rec := serve(h, "/", nil); rec.Code != http.StatusOK {
		t.Fatalf("after the client went: %d", rec.Code)
	}
	if got := held(t, r, "one", "u1"); got != ":0" {
		t.Fatalf("leases at the end: %s", got)
	}
}

// In a layered middleware a concurrency rule holds a lease and a rate rule counts: a
// request the lease denies consumes nothing from the rate rule, and one the rate rule
// denies gives its lease back.
func TestMiddlewareConcurrencyWithRateRules(t *testing.T) {
	l, r := concLimiter(t)
	slow := newSlow()
	h := Middleware(MiddlewareOptions{Limiter: l, Rules: []Rule{
		{Policy: "rate", Key: keyU1},
		{Policy: "one", Key: keyU1},
	}}, slow)
	codes := make(chan int, 1)
	go func() { codes <- serve(h, "/", nil).Code }()
	<-slow.entered
	for i := 0; i < 3; i++ {
		if rec := serve(h, "/", nil); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("request %d behind the lease: %d", i, rec.Code)
		}
	}
	d, err := l.Peek(context.Background(), "u1", "rate")
	if err != nil || d.Remaining != 2 {
		t.Fatalf("the lease's denials consumed from the rate rule: %+v %v", d, err)
	}
	close(slow.release)
	if c := <-codes; c != http.StatusOK {
		t.Fatalf("first: %d", c)
	}
	// two more pass (the rate rule's 3), one at a time
	for i := 0; i < 2; i++ {
		if rec := serve(h, "/", nil); rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}
	// the rate rule denies: the lease taken for the request is given back
	if rec := serve(h, "/", nil); rec.Code != http.StatusTooManyRequests || rec.Header().Get("X-RateLimit-Limit") != "3" {
		t.Fatalf("over the rate: %d %v", rec.Code, rec.Header())
	}
	if got := held(t, r, "one", "u1"); got != ":0" {
		t.Fatalf("leases at the end: %s", got)
	}
	// a concurrency policy cannot run in shadow: refused when the middleware is built
	if _, err := NewMiddleware(context.Background(), MiddlewareOptions{Limiter: l, Policy: "one", Shadow: true}); err == nil {
		t.Fatal("Shadow on a concurrency policy was accepted")
	}
}
