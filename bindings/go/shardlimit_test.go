package shardlimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestVersion(t *testing.T) {
	if Version() != HeaderVersion {
		t.Fatalf("library %s, header %s", Version(), HeaderVersion)
	}
}

// 64 goroutines race for a sliding log of 1000 units (exact, and no window boundary to
// cross while the test runs): exactly 1000 are admitted.
func TestExactAdmissionUnderManyGoroutines(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"exact":{"algorithm":"sliding_log","limit":1000,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const goroutines, each = 64, 40 // 2560 attempts for 1000 units
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				d, err := l.Check(context.Background(), "tenant:{acme}", "exact", 1)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if allowed.Load() != 1000 || denied.Load() != goroutines*each-1000 {
		t.Fatalf("allowed %d, denied %d; want exactly 1000 allowed", allowed.Load(), denied.Load())
	}
	d, err := l.Check(context.Background(), "tenant:{acme}", "exact", 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Remaining != 0 || !d.HasRetryAfter || d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
		t.Fatalf("after the limit: %+v", d)
	}
	if d.Source != SourceRedis || d.Source.String() != "redis" || d.Shard != 0 || d.Policy != "exact" {
		t.Fatalf("decision fields: source %v shard %d policy %q", d.Source, d.Shard, d.Policy)
	}
}

func TestDecisionRendering(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":2,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if d, err := l.Check(ctx, "k", "api", 1); err != nil || !d.Allowed || d.Remaining != uint64(1-i) {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
	}
	d, err := l.Check(ctx, "k", "api", 1)
	if err != nil || d.Allowed {
		t.Fatalf("third check: %+v %v", d, err)
	}
	h, err := d.Headers()
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, x := range h {
		names = append(names, x.Name)
	}
	want := "X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset RateLimit-Policy RateLimit Retry-After"
	if strings.Join(names, " ") != want {
		t.Fatalf("headers %v", h)
	}
	if h[0].Value != "2" || h[1].Value != "0" || h[3].Value != `"api";q=2;w=3600` {
		t.Fatalf("header values %v", h)
	}
	// X-RateLimit-Reset is the Unix time of the reset (as the middleware sends it, and every
	// language); RateLimit's t keeps delta seconds
	reset, err := strconv.ParseInt(h[2].Value, 10, 64)
	wall := time.Now().Add(d.ResetAfter).Unix()
	if err != nil || reset < wall-1 || reset > wall+1 {
		t.Fatalf("X-RateLimit-Reset %q, want about %d", h[2].Value, wall)
	}
	body, err := d.Body()
	if err != nil {
		t.Fatal(err)
	}
	var b map[string]any
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	if b["error"] != "rate_limited" || b["policy"] != "api" || b["limit"] != float64(2) {
		t.Fatalf("body %s", body)
	}
	// a cost that can never fit: no retry
	d, err = l.Check(ctx, "other", "api", 3)
	if err != nil || d.Allowed || d.HasRetryAfter {
		t.Fatalf("oversized cost: %+v %v", d, err)
	}
}

func TestErrors(t *testing.T) {
	r := startRedis(t)
	bad := []struct {
		config string
		want   error
		field  string
	}{
		{`{`, ErrConfig, "not valid JSON"},
		{`{"policies":{"a":{"algorithm":"fixed_window","limit":5,"window":"abc"}}}`, ErrConfig, "policies.a.window"},
		{`{"policies":{"a":{"algorithm":"magic","limit":5}}}`, ErrConfig, "policies.a.algorithm"},
		{`{"shards":[{"name":"a","url":"http://x"}]}`, ErrConfig, "shards[0].url"},
		{`{"shards":[]}`, ErrConfig, "shards"},
		{"\xff", ErrConfig, "UTF-8"},
	}
	for _, c := range bad {
		l, err := NewFromJSON(c.config)
		if l != nil || !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("NewFromJSON(%q) = %v, %v; want %v naming %q", c.config, l, err, c.want, c.field)
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeConfig || e.Code.String() != "config" || e.IsBackend() {
			t.Errorf("error fields: %#v", err)
		}
	}
	if _, err := NewFromConfigFile(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, ErrIO) {
		t.Errorf("missing file: %v", err)
	}
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(r.config(`"p":{"algorithm":"token_bucket","capacity":1,"refill_per_sec":1}`)), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := NewFromConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	calls := []struct {
		key, policy string
		cost        uint64
		want        error
	}{
		{"k", "nope", 1, ErrUnknownPolicy},
		{"", "p", 1, ErrInvalidArgument},
		{"k", "p", 0, ErrInvalidArgument},
		{"a\x00b", "p", 1, ErrInvalidArgument},
		{"\xff", "p", 1, ErrInvalidArgument},
		{strings.Repeat("k", 1025), "p", 1, ErrInvalidArgument},
	}
	for _, c := range calls {
		if _, err := l.Check(ctx, c.key, c.policy, c.cost); !errors.Is(err, c.want) {
			t.Errorf("Check(%q, %q, %d) = %v; want %v", c.key, c.policy, c.cost, err, c.want)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Check(cancelled, "k", "p", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	if d, err := l.Check(ctx, "k", "p", 1); err != nil || !d.Allowed {
		t.Errorf("valid check: %+v %v", d, err)
	}
	l.Close()
	l.Close()
	if _, err := l.Check(ctx, "k", "p", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// A shard nobody listens on: with on_error "error" the backend error comes back; with
// "closed" the core denies with a fallback decision; within the deadline either way.
func TestDeadShard(t *testing.T) {
	port := freePort(t)
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"dead","url":"redis://127.0.0.1:%d"}],"timeout_ms":300,
		"policies":{"strict":{"algorithm":"fixed_window","limit":5,"window":"1s","on_error":"error"},
		            "closed":{"algorithm":"fixed_window","limit":5,"window":"1s","on_error":"closed"}}}`, port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	_, err = l.Check(context.Background(), "k", "strict", 1)
	var e *Error
	if !errors.As(err, &e) || !e.IsBackend() || !strings.Contains(e.Message, "dead") {
		t.Fatalf("dead shard, on_error error: %#v", err)
	}
	d, err := l.Check(context.Background(), "k", "closed", 1)
	if err != nil || d.Allowed || d.Source != SourceFallback {
		t.Fatalf("dead shard, on_error closed: %+v %v", d, err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("took %v", elapsed)
	}
}

func TestCheckAllAndBlockList(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"ip":{"algorithm":"fixed_window","limit":10,"window":"1h"},
		"tenant":{"algorithm":"fixed_window","limit":2,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	layers := []Layer{{"ip:1", "ip", 1}, {"tenant:1", "tenant", 1}}
	for i := 0; i < 2; i++ {
		if d, err := l.CheckAll(ctx, layers); err != nil || !d.Allowed {
			t.Fatalf("layered %d: %+v %v", i, d, err)
		}
	}
	d, err := l.CheckAll(ctx, layers)
	if err != nil || d.Allowed || d.Layer != 1 || d.Policy != "tenant" {
		t.Fatalf("tenant layer should deny: %+v %v", d, err)
	}
	if d, _ := l.Check(ctx, "ip:1", "ip", 1); d.Remaining != 7 { // 10 - 2 - this one
		t.Fatalf("a denied layered check consumed the ip layer: %+v", d)
	}
	if _, err := l.CheckAll(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no layers: %v", err)
	}
	if _, err := l.CheckAll(ctx, []Layer{{"k", "nope", 1}}); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown layer policy: %v", err)
	}

	if err := l.Block(ctx, "ip:6", time.Minute, "scraping"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Check(ctx, "ip:6", "ip", 1); err != nil || d.Allowed || d.Source != SourceBlock {
		t.Fatalf("blocked key: %+v %v", d, err)
	}
	info, err := l.Blocked(ctx, "ip:6")
	if err != nil || info == nil || info.Reason != "scraping" || info.Permanent || info.Remaining <= 0 || info.Remaining > time.Minute {
		t.Fatalf("Blocked: %+v %v", info, err)
	}
	if was, err := l.Unblock(ctx, "ip:6"); err != nil || !was {
		t.Fatalf("Unblock: %v %v", was, err)
	}
	if info, err := l.Blocked(ctx, "ip:6"); err != nil || info != nil {
		t.Fatalf("after Unblock: %+v %v", info, err)
	}
	if err := l.Block(ctx, "", 0, ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty key: %v", err)
	}
}

func TestPeekResetAcquireRelease(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":5,"window":"1h"},
		"jobs":{"algorithm":"concurrency","max":2,"lease_ttl":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()

	// Peek reads without consuming; Reset gives the full budget back
	for i := 0; i < 3; i++ {
		if d, err := l.Check(ctx, "u:1", "api", 1); err != nil || !d.Allowed {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
	}
	for i := 0; i < 2; i++ {
		d, err := l.Peek(ctx, "u:1", "api")
		if err != nil || !d.Allowed || d.Remaining != 2 || d.Policy != "api" || d.Source != SourceRedis {
			t.Fatalf("peek %d: %+v %v", i, d, err)
		}
	}
	if err := l.Reset(ctx, "u:1", "api"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Peek(ctx, "u:1", "api"); err != nil || d.Remaining != 5 {
		t.Fatalf("after Reset: %+v %v", d, err)
	}

	// two leases fit, the third is denied with no lease; a release frees one unit once
	d1, a, err := l.Acquire(ctx, "tenant:7", "jobs", 1)
	if err != nil || !d1.Allowed || a == nil || d1.Remaining != 1 {
		t.Fatalf("first acquire: %+v %v %v", d1, a, err)
	}
	d2, b, err := l.Acquire(ctx, "tenant:7", "jobs", 1)
	if err != nil || !d2.Allowed || b == nil || d2.Remaining != 0 {
		t.Fatalf("second acquire: %+v %v %v", d2, b, err)
	}
	d3, c, err := l.Acquire(ctx, "tenant:7", "jobs", 1)
	if err != nil || d3.Allowed || c != nil {
		t.Fatalf("third acquire should be denied without a lease: %+v %v %v", d3, c, err)
	}
	if was, err := a.Release(ctx); err != nil || !was {
		t.Fatalf("release: %v %v", was, err)
	}
	if was, err := a.Release(ctx); err != nil || was {
		t.Fatalf("a second release must report false: %v %v", was, err)
	}
	if d, err := l.Peek(ctx, "tenant:7", "jobs"); err != nil || d.Remaining != 1 {
		t.Fatalf("after one release: %+v %v", d, err)
	}
	d4, e, err := l.Acquire(ctx, "tenant:7", "jobs", 1)
	if err != nil || !d4.Allowed || e == nil {
		t.Fatalf("acquire after release: %+v %v", d4, err)
	}

	// bad input: a clear error, never a crash
	if _, err := c.Release(ctx); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil lease: %v", err)
	}
	if _, err := l.Peek(ctx, "u:1", "nope"); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
	if err := l.Reset(ctx, "", "api"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty key: %v", err)
	}
	if _, _, err := l.Acquire(ctx, "tenant:7", "jobs", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("zero units: %v", err)
	}
	// a lease of a policy that is not a concurrency limit could never be released: refused,
	// taking nothing
	if d, lease, err := l.Acquire(ctx, "u:1", "api", 1); !errors.Is(err, ErrInvalidArgument) ||
		lease != nil || !strings.Contains(err.Error(), "not a concurrency policy") {
		t.Fatalf("acquire of a fixed window: %+v %v %v", d, lease, err)
	}
	if d, err := l.Peek(ctx, "u:1", "api"); err != nil || d.Remaining != 5 {
		t.Fatalf("after a refused acquire: %+v %v", d, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Peek(cancelled, "u:1", "api"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}

	// after Close: ErrClosed, and the lease is not released (it expires with its TTL)
	l.Close()
	if _, err := b.Release(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("release after Close: %v", err)
	}
	if _, err := l.Peek(ctx, "u:1", "api"); !errors.Is(err, ErrClosed) {
		t.Fatalf("peek after Close: %v", err)
	}
}

func TestClientIP(t *testing.T) {
	trusted := []string{"10.0.0.0/8"}
	cases := []struct{ peer, xff, want string }{
		{"10.1.2.3:443", "203.0.113.9, 198.51.100.7", "198.51.100.7"},
		{"203.0.113.5:1234", "1.1.1.1", "203.0.113.5"},
		{"[::1]:80", "", "::1"},
	}
	for _, c := range cases {
		if got, err := ClientIP(c.peer, c.xff, trusted); err != nil || got != c.want {
			t.Errorf("ClientIP(%q, %q) = %q, %v; want %q", c.peer, c.xff, got, err, c.want)
		}
	}
	if _, err := ClientIP("nope", "", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad peer: %v", err)
	}
	if _, err := ClientIP("10.0.0.1", "", []string{"10.0.0.0/99"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad CIDR: %v", err)
	}
}

func TestMiddleware(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":2,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var served atomic.Int64
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "api"}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	var codes []int
	var last *http.Response
	var lastBody []byte
	for i := 0; i < 3; i++ {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		lastBody, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.Header.Get("X-RateLimit-Limit") != "2" || resp.Header.Get("RateLimit-Policy") == "" {
			t.Fatalf("missing headers: %v", resp.Header)
		}
		last = resp
	}
	if fmt.Sprint(codes) != "[200 200 429]" || served.Load() != 2 {
		t.Fatalf("codes %v, served %d", codes, served.Load())
	}
	if last.Header.Get("Retry-After") == "" || last.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("429 headers: %v", last.Header)
	}
	var b map[string]any
	if err := json.Unmarshal(lastBody, &b); err != nil || b["error"] != "rate_limited" {
		t.Fatalf("429 body %s: %v", lastBody, err)
	}

	// an unknown policy is a mistake made when the middleware is built: it panics then,
	// naming the policy, rather than failing every request
	func() {
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(fmt.Sprint(r), "nope") {
				t.Fatalf("building with an unknown policy: recovered %v", r)
			}
		}()
		Middleware(MiddlewareOptions{Limiter: l, Policy: "nope"}, http.NotFoundHandler())
	}()

	// errors of a request go to OnError (here: the limiter was closed after the build)
	other, err := NewFromJSON(`{"policies": {"api": {"algorithm": "fixed_window", "limit": 2, "window": "1m"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	var got error
	bad := Middleware(MiddlewareOptions{Limiter: other, Policy: "api", OnError: func(w http.ResponseWriter, _ *http.Request, err error) {
		got = err
		w.WriteHeader(http.StatusTeapot)
	}}, http.NotFoundHandler())
	other.Close()
	rec := httptest.NewRecorder()
	bad.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusTeapot || !errors.Is(got, ErrClosed) {
		t.Fatalf("OnError: %d %v", rec.Code, got)
	}
}

func TestClientIPKey(t *testing.T) {
	for _, c := range []struct {
		peer   string
		prefix int
		want   string
	}{
		{"[2001:db8:1:2:aaaa::5]:443", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:bbbb::9", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:bbbb::9", 56, "2001:db8:1::/56"},
		{"[::ffff:198.51.100.7]:80", 64, "198.51.100.7"},
		{"198.51.100.7:80", 64, "198.51.100.7"},
	} {
		if got, err := ClientIPKey(c.peer, "", nil, c.prefix); err != nil || got != c.want {
			t.Errorf("ClientIPKey(%q, %d) = %q, %v; want %q", c.peer, c.prefix, got, err, c.want)
		}
	}
	for _, bad := range []int{0, 129, -1, 1000} {
		if _, err := ClientIPKey("2001:db8::1", "", nil, bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("prefix %d: %v, want ErrInvalidArgument", bad, err)
		}
	}
	// the middleware's default key: two addresses of one /64 share a budget
	r1 := httptest.NewRequest("GET", "/", nil)
	r1.RemoteAddr = "[2001:db8:1:2::1]:1000"
	r2 := httptest.NewRequest("GET", "/", nil)
	r2.RemoteAddr = "[2001:db8:1:2::2]:2000"
	if k1, k2 := RequestKey(r1, nil, DefaultIPv6Prefix), RequestKey(r2, nil, DefaultIPv6Prefix); k1 != k2 {
		t.Errorf("one /64, two keys: %q, %q", k1, k2)
	}
}
