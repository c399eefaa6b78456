package shardlimit

import (
	"context"
	"net/http"
	"testing"
)

// DeductWhen counts only the responses it accepts: a login limit that counts failures
// only, on Redis, through one rule (Reserve and Settle) and through two (CheckAll and
// refunds).
func TestMiddlewareDeductWhenCountsOnlyFailures(t *testing.T) {
	s := startRedis(t)
	l, err := NewFromJSON(s.config(`"login":{"algorithm":"fixed_window","limit":3,"window":"1h"},
		"tenant":{"algorithm":"fixed_window","limit":100,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("pw") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	failures := func(status int) bool { return status >= 400 }
	byUser := func(r *http.Request) string { return r.Header.Get("X-User") }
	one := Middleware(MiddlewareOptions{Limiter: l, Policy: "login", Key: byUser, DeductWhen: failures}, login)
	two := Middleware(MiddlewareOptions{Limiter: l, DeductWhen: failures, Rules: []Rule{
		{Policy: "login", Key: byUser},
		{Policy: "tenant", Key: func(*http.Request) string { return "t1" }},
	}}, login)
	ctx := context.Background()
	for name, h := range map[string]http.Handler{"u1": one, "u2": two} {
		hdr := map[string]string{"X-User": name}
		for i := 0; i < 5; i++ {
			if rec := serve(h, "/login?pw=right", hdr); rec.Code != 200 {
				t.Fatalf("%s: a success: %d", name, rec.Code)
			}
		}
		if d, _ := l.Peek(ctx, name, "login"); d.Remaining != 3 {
			t.Fatalf("%s: successes are given back: %+v", name, d)
		}
		for i := 0; i < 3; i++ {
			if rec := serve(h, "/login?pw=wrong", hdr); rec.Code != 401 {
				t.Fatalf("%s: a failure: %d", name, rec.Code)
			}
		}
		if rec := serve(h, "/login?pw=right", hdr); rec.Code != 429 {
			t.Fatalf("%s: three failures use the budget up: %d", name, rec.Code)
		}
	}
	// the two-rule handler gave its tenant layer back too: 3 failures counted there
	if d, _ := l.Peek(ctx, "t1", "tenant"); d.Remaining != 97 {
		t.Fatalf("tenant layer: %+v", d)
	}
}
