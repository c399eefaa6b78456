package shardlimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

func serve(h http.Handler, path string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", path, nil)
	req.RemoteAddr = "203.0.113.7:1234"
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if d, found := DecisionFrom(r.Context()); found {
		w.Header().Set("X-Source", d.Source.String())
	}
	w.WriteHeader(http.StatusOK)
})

// Layered rules (per IP and per API key): both must allow; a rule whose key is empty
// (no API key) does not apply; Skip exempts a request entirely.
func TestMiddlewareRulesAndSkip(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"ip":{"algorithm":"fixed_window","limit":3,"window":"1h"},
		"key":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := Middleware(MiddlewareOptions{
		Limiter: l,
		Rules: []Rule{
			{Policy: "ip"},
			{Policy: "key", Key: func(r *http.Request) string { return r.Header.Get("X-API-Key") }},
		},
		Skip: func(r *http.Request) bool { return r.URL.Path == "/health" },
	}, ok)
	for i := 0; i < 5; i++ {
		if rec := serve(h, "/health", nil); rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("/health: %d %v", rec.Code, rec.Header())
		}
	}
	var codes []int
	codes = append(codes, serve(h, "/", map[string]string{"X-API-Key": "a"}).Code) // ip 1, key 1
	codes = append(codes, serve(h, "/", map[string]string{"X-API-Key": "a"}).Code) // key denies: nothing consumed
	codes = append(codes, serve(h, "/", nil).Code)                                 // ip 2
	codes = append(codes, serve(h, "/", nil).Code)                                 // ip 3
	rec := serve(h, "/", nil)                                                      // ip denies
	codes = append(codes, rec.Code)
	if fmt.Sprint(codes) != "[200 429 200 200 429]" {
		t.Fatalf("codes %v", codes)
	}
	if rec.Header().Get("X-RateLimit-Limit") != "3" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("429 headers %v", rec.Header())
	}
	// the handler sees the decision
	l2, _ := NewFromJSON(`{"policies":{"ip":{"algorithm":"fixed_window","limit":3,"window":"1h"}}}`)
	defer l2.Close()
	rec = serve(Middleware(MiddlewareOptions{Limiter: l2, Policy: "ip"}, ok), "/", nil)
	if rec.Code != 200 || rec.Header().Get("X-Source") != "memory" {
		t.Fatalf("decision in the handler: %d %v", rec.Code, rec.Header())
	}
}

// A Key that returns "" lets the request through unchecked (it was a 503).
func TestMiddlewareEmptyKeySkips(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", Key: func(r *http.Request) string { return r.Header.Get("X-User") }}, ok)
	for i := 0; i < 3; i++ {
		if rec := serve(h, "/", nil); rec.Code != 200 || rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("no key: %d %v", rec.Code, rec.Header())
		}
	}
	if rec := serve(h, "/", map[string]string{"X-User": "u"}); rec.Code != 200 {
		t.Fatalf("first: %d", rec.Code)
	}
	if rec := serve(h, "/", map[string]string{"X-User": "u"}); rec.Code != 429 {
		t.Fatalf("second: %d", rec.Code)
	}
}

// X-RateLimit-Reset is the Unix time of the reset; custom 429 handler.
func TestMiddlewareResetIsATimestampAndCustom429(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var limited Decision
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", OnLimited: func(w http.ResponseWriter, _ *http.Request, d Decision) {
		limited = d
		w.WriteHeader(http.StatusTeapot)
	}}, ok)
	before := time.Now().Unix()
	rec := serve(h, "/", nil)
	after := time.Now().Unix()
	reset, err := strconv.ParseInt(rec.Header().Get("X-RateLimit-Reset"), 10, 64)
	if err != nil || reset < before || reset > after+3601 {
		t.Fatalf("X-RateLimit-Reset %q (now %d): %v", rec.Header().Get("X-RateLimit-Reset"), before, err)
	}
	if rec := serve(h, "/", nil); rec.Code != http.StatusTeapot || limited.Allowed || limited.Policy != "api" {
		t.Fatalf("custom 429: %d %+v", rec.Code, limited)
	}
}

// A fallback that denies (on_error closed, Redis unreachable) is a 503 with Retry-After
// and no rate-limit headers, never a 429; a custom handler can answer instead.
func TestMiddlewareDenyingFallbackIs503(t *testing.T) {
	port := freePort(t) // nothing listens there: connection refused
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":500,
		"policies":{"api":{"algorithm":"fixed_window","limit":5,"window":"1h","on_error":"closed"}}}`, port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d, err := l.Check(context.Background(), "k", "api", 1)
	if err != nil || d.Allowed || d.Source != SourceFallback {
		t.Fatalf("precondition, a denying fallback: %+v %v", d, err)
	}
	rec := serve(Middleware(MiddlewareOptions{Limiter: l, Policy: "api"}, ok), "/", nil)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("code %d, want 503", rec.Code)
	}
	if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
	}
	if rec.Header().Get("X-RateLimit-Limit") != "" || rec.Header().Get("X-RateLimit-Remaining") != "" {
		t.Fatalf("rate-limit headers on a 503: %v", rec.Header())
	}
	// the body every binding's middleware sends (tower, Python, Node): the core's, with
	// "error": "rate_limit_unavailable"
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body["error"] != "rate_limit_unavailable" || body["policy"] != "api" {
		t.Fatalf("503 body %s (%v)", rec.Body.Bytes(), err)
	}
	custom := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", OnUnavailable: func(w http.ResponseWriter, _ *http.Request, d Decision) {
		w.WriteHeader(http.StatusBadGateway)
	}}, ok)
	if rec := serve(custom, "/", nil); rec.Code != http.StatusBadGateway || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("custom 503: %d %v", rec.Code, rec.Header())
	}
}

// on_error local decides with this process's share of the limit: a real decision, so its
// denial is a 429 with its own Retry-After and budget headers, not the 503 of an outage.
func TestMiddlewareLocalFallbackDenialIs429(t *testing.T) {
	port := freePort(t) // nothing listens there: connection refused
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":500,
		"instances":1,"on_error":"local",
		"policies":{"api":{"algorithm":"fixed_window","limit":2,"window":"1h"}}}`, port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	unavailable := false
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", Key: func(*http.Request) string { return "k" },
		OnUnavailable: func(w http.ResponseWriter, _ *http.Request, d Decision) {
			unavailable = true
			w.WriteHeader(http.StatusServiceUnavailable)
		}}, ok)
	for _, left := range []string{"1", "0"} {
		rec := serve(h, "/", nil)
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != left {
			t.Fatalf("admitted: %d %v", rec.Code, rec.Header())
		}
	}
	rec := serve(h, "/", nil)
	if rec.Code != http.StatusTooManyRequests || unavailable {
		t.Fatalf("code %d, want 429 (a local decision is not an outage)", rec.Code)
	}
	if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 || ra > 3600 {
		t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
	}
	if rec.Header().Get("X-RateLimit-Remaining") != "0" || rec.Header().Get("X-RateLimit-Status") != "" {
		t.Fatalf("headers of a local denial: %v", rec.Header())
	}
	d, err := l.Check(context.Background(), "k", "api", 1)
	if err != nil || d.Allowed || d.Source != SourceLocalFallback || d.Source.String() != "local_fallback" {
		t.Fatalf("a local denial: %+v %v", d, err)
	}
}

// Headers chooses the header set; Retry-After can be an HTTP date; the 503's Retry-After
// is configurable.
func TestMiddlewareHeaderOptions(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	has := func(rec *httptest.ResponseRecorder, names ...string) string {
		var got []string
		for _, n := range names {
			if rec.Header().Get(n) != "" {
				got = append(got, n)
			}
		}
		return fmt.Sprint(got)
	}
	all := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy"}
	for i, c := range []struct {
		set  HeaderSet
		want string
	}{
		{HeadersBoth, fmt.Sprint(all)},
		{HeadersLegacy, fmt.Sprint(all[:3])},
		{HeadersStandard, fmt.Sprint(all[3:])},
		{HeadersNone, "[]"},
	} {
		h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", Headers: c.set,
			Key: func(*http.Request) string { return fmt.Sprint("k", i) }}, ok)
		if rec := serve(h, "/", nil); rec.Code != 200 || has(rec, all...) != c.want {
			t.Errorf("set %d: %d %s, want %s", c.set, rec.Code, has(rec, all...), c.want)
		}
		// a denial always carries Retry-After, whatever the set
		if rec := serve(h, "/", nil); rec.Code != 429 || rec.Header().Get("Retry-After") == "" {
			t.Errorf("set %d denied: %d %v", c.set, rec.Code, rec.Header())
		}
	}
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", RetryAfterDate: true,
		Key: func(*http.Request) string { return "dated" }}, ok)
	serve(h, "/", nil)
	rec := serve(h, "/", nil)
	when, err := http.ParseTime(rec.Header().Get("Retry-After"))
	if rec.Code != 429 || err != nil || !when.After(time.Now()) || when.After(time.Now().Add(61*time.Minute)) {
		t.Fatalf("Retry-After as a date: %d %q %v", rec.Code, rec.Header().Get("Retry-After"), err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an unknown HeaderSet was accepted")
		}
	}()
	Middleware(MiddlewareOptions{Limiter: l, Policy: "api", Headers: HeaderSet(9)}, ok)
}

// UnavailableRetryAfter sets the 503's Retry-After.
func TestMiddlewareUnavailableRetryAfter(t *testing.T) {
	port := freePort(t)
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":500,
		"policies":{"api":{"algorithm":"fixed_window","limit":5,"window":"1h","on_error":"closed"}}}`, port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rec := serve(Middleware(MiddlewareOptions{Limiter: l, Policy: "api", UnavailableRetryAfter: 7 * time.Second}, ok), "/", nil)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "7" {
		t.Fatalf("%d Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
}
