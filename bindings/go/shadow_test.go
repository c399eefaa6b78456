package shardlimit

import (
	"context"
	"errors"
	"net/http"
	"testing"
)

func hasCode(err error, c Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == c
}

// Shadow mode from Go, on Redis: a policy in shadow and the per-call CheckShadow allow a
// would-be denial with ShadowDenied, and ShadowReport reads the counts back from Redis.
func TestShadowModeAndReport(t *testing.T) {
	s := startRedis(t)
	l, err := NewFromJSON(s.config(`"new":{"algorithm":"fixed_window","limit":1,"window":"1h","shadow":true},
		"old":{"algorithm":"fixed_window","limit":1,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i, want := range []bool{false, true, true} {
		d, err := l.Check(ctx, "u1", "new", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.ShadowDenied != want || d.HasRetryAfter {
			t.Fatalf("check %d: %+v", i, d)
		}
	}
	if d, _ := l.Check(ctx, "u2", "old", 1); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if d, _ := l.Check(ctx, "u2", "old", 1); d.Allowed || d.ShadowDenied {
		t.Fatalf("enforcing: %+v", d)
	}
	d, err := l.CheckShadow(ctx, "u2", "old", 1)
	if err != nil || !d.Allowed || !d.ShadowDenied {
		t.Fatalf("CheckShadow: %+v %v", d, err)
	}
	r, err := l.ShadowReport(ctx, "new", 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Policy != "new" || r.Total != 2 || r.Untracked != 0 || len(r.Keys) != 1 || r.Keys[0] != (ShadowKey{"u1", 2}) {
		t.Fatalf("report %+v", r)
	}
	r, err = l.ShadowReport(ctx, "old", 1)
	if err != nil || r.Total != 1 || r.Keys[0].Key != "u2" {
		t.Fatalf("report %+v %v", r, err)
	}
	if _, err := l.ShadowReport(ctx, "a:b", 0); !hasCode(err, CodeInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := l.CheckShadow(ctx, "u2", "nope", 1); !hasCode(err, CodeUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
}

// Through the net/http middleware: a shadow-denied request reaches the handler (200),
// with no Retry-After and no remaining budget in its headers.
func TestMiddlewareLetsShadowDenialsThrough(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"new":{"algorithm":"fixed_window","limit":1,"window":"1h","shadow":true}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "new"}, ok)
	if rec := serve(h, "/", nil); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("first: %d %v", rec.Code, rec.Header())
	}
	for i := 0; i < 2; i++ {
		rec := serve(h, "/", nil)
		if rec.Code != http.StatusOK {
			t.Fatalf("shadow-denied request got %d", rec.Code)
		}
		for _, name := range []string{"Retry-After", "X-RateLimit-Remaining", "RateLimit", "X-RateLimit-Reset"} {
			if v := rec.Header().Get(name); v != "" {
				t.Fatalf("%s: %q says the client is limited", name, v)
			}
		}
		if rec.Header().Get("X-RateLimit-Limit") != "1" {
			t.Fatalf("headers %v", rec.Header())
		}
	}
	r, err := l.ShadowReport(context.Background(), "new", 0)
	if err != nil || r.Total != 2 {
		t.Fatalf("report %+v %v", r, err)
	}
}
