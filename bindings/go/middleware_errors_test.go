package shardlimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// Behind a proxy on a Unix socket, http.Server gives every request the RemoteAddr "@":
// the default key must not make all clients one. Without "unix" in TrustedProxies the
// request is refused (500, naming the cause); with it the client comes from the
// proxy's X-Forwarded-For, so two clients have two budgets.
func TestMiddlewareDefaultKeyOnAUnixSocket(t *testing.T) {
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":1,"window":"1h"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	unix := func(h http.Handler, xff string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "@"
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	refused := Middleware(MiddlewareOptions{Limiter: l, Policy: "api"}, ok)
	rec := unix(refused, "198.51.100.1")
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "Unix socket") ||
		!strings.Contains(rec.Body.String(), "TrustedProxies") {
		t.Fatalf("a Unix socket peer without \"unix\" trusted: %d %s, want 500 naming the cause", rec.Code, rec.Body)
	}
	trusting := Middleware(MiddlewareOptions{Limiter: l, Policy: "api", TrustedProxies: []string{"unix"}}, ok)
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		if rec := unix(trusting, client); rec.Code != http.StatusOK {
			t.Fatalf("client %s, first request: %d %s", client, rec.Code, rec.Body)
		}
	}
	if rec := unix(trusting, "198.51.100.1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("client 198.51.100.1, second request: %d, want 429 (its own budget of 1)", rec.Code)
	}
	// a spoofed hop before the proxy's is not believed: the proxy appends the real peer
	if rec := unix(trusting, "203.0.113.9, 198.51.100.2"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("client 198.51.100.2 behind a spoofed hop: %d, want 429", rec.Code)
	}
	if rec := unix(trusting, ""); rec.Code != http.StatusInternalServerError {
		t.Fatalf("no X-Forwarded-For from the Unix socket proxy: %d, want 500", rec.Code)
	}
}

// on_error "error" with Redis down: every request fails its check. The default answer
// is JSON 503 with Retry-After, as the other languages answer, and the log gets one
// line, not one per request.
func TestMiddlewareOnErrorErrorIsJSON503WithRetryAfterAndOneLogLine(t *testing.T) {
	l, err := NewFromJSON(fmt.Sprintf(`{"timeout_ms": 200,
		"shards": [{"name": "dead", "url": "redis://127.0.0.1:%d"}],
		"policies": {"api": {"rate": "10/minute", "on_error": "error"}}}`, freePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var logged bytes.Buffer
	log.SetOutput(&logged)
	defer log.SetOutput(os.Stderr)
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api"}, ok)
	for i := 0; i < 5; i++ {
		rec := serve(h, "/", nil)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" ||
			rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("request %d: %d %v, want 503 JSON with Retry-After 1", i, rec.Code, rec.Header())
		}
		var body map[string]string
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body["error"] != "rate_limit_unavailable" || body["message"] == "" {
			t.Fatalf("request %d: body %s (%v)", i, rec.Body, err)
		}
	}
	// (the library's own warning lines, a circuit opened, go to the same log: not counted)
	if n := strings.Count(logged.String(), "shardlimit: GET /: "); n != 1 {
		t.Fatalf("the middleware logged %d lines for 5 failed checks, want 1:\n%s", n, logged.String())
	}
}
