package shardlimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A leaky bucket admits a request for later (Decision.Delay): the middleware holds it for
// that long before the handler runs, as Node's and tower's middlewares do.
func TestMiddlewareHoldsALeakyBucketsDelay(t *testing.T) {
	l, err := NewFromJSON(`{"policies": {"shaped": {"algorithm": "leaky_bucket", "capacity": 3, "leak_per_sec": 4}}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []time.Duration
	h := Middleware(MiddlewareOptions{Limiter: l, Policy: "shaped", Key: func(*http.Request) string { return "k" }},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := DecisionFrom(r.Context())
			held = append(held, d.Delay)
		}))
	for i := 0; i < 3; i++ {
		start := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		took := time.Since(start)
		if rec.Code != http.StatusOK || len(held) != i+1 {
			t.Fatalf("request %d: %d, handler ran %d times", i, rec.Code, len(held))
		}
		if took < held[i] {
			t.Fatalf("request %d: delay %v, but the handler ran after %v", i, held[i], took)
		}
	}
	// the bucket drips 4/s: the first request is served at once, the second, sent right
	// after it, waits for its slot (about 250 ms)
	if held[0] != 0 || held[1] <= 0 {
		t.Fatalf("delays %v: the first is served at once, the second waits its slot", held)
	}
}
