package shardlimit

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// Charge into debt, refund, reserve and settle, on Redis and in memory.
func TestChargeRefundReserveSettle(t *testing.T) {
	s := startRedis(t)
	policies := `"tokens":{"algorithm":"fixed_window","limit":10,"window":"1h"},
		"conc":{"algorithm":"concurrency","max":2,"lease_ttl":"1s"}`
	onRedis, err := NewFromJSON(s.config(policies))
	if err != nil {
		t.Fatal(err)
	}
	defer onRedis.Close()
	inMemory, err := NewFromJSON(`{"policies":{` + policies + `}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer inMemory.Close()
	ctx := context.Background()
	for name, l := range map[string]*Limiter{"redis": onRedis, "memory": inMemory} {
		d, err := l.Charge(ctx, "llm", "tokens", 14)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: charge: %+v %v", name, d, err)
		}
		if d, _ := l.Check(ctx, "llm", "tokens", 1); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%s: in debt, a check must be denied: %+v", name, d)
		}
		if d, err := l.Refund(ctx, "llm", "tokens", 99); err != nil || d.Remaining != 10 {
			t.Fatalf("%s: refund never above the limit: %+v %v", name, d, err)
		}
		d, r, err := l.Reserve(ctx, "llm", "tokens", 8)
		if err != nil || !d.Allowed || r == nil || r.Units != 8 || d.Remaining != 2 {
			t.Fatalf("%s: reserve: %+v %+v %v", name, d, r, err)
		}
		if d, err := r.Settle(ctx, 3); err != nil || d.Remaining != 7 {
			t.Fatalf("%s: settle: %+v %v", name, d, err)
		}
		if _, err := r.Settle(ctx, 3); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s: a second settle: %v", name, err)
		}
		d, r, err = l.Reserve(ctx, "llm", "tokens", 11)
		if err != nil || d.Allowed || r != nil {
			t.Fatalf("%s: a reserve above the limit is denied with no reservation: %+v %v", name, d, err)
		}
		if _, err := r.Settle(ctx, 1); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s: settle of nil: %v", name, err)
		}
		if _, err := l.Charge(ctx, "llm", "conc", 1); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s: a concurrency policy: %v", name, err)
		}
		if _, err := l.Charge(ctx, "llm", "tokens", 0); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%s: cost 0: %v", name, err)
		}
	}
	// 64 goroutines reserving and settling on one key keep the books exact
	var wg sync.WaitGroup
	used := make([]uint64, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, r, err := onRedis.Reserve(ctx, "hot", "tokens", 1)
			if err != nil {
				t.Error(err)
				return
			}
			if r == nil {
				return // denied: nothing used
			}
			actual := uint64(i % 2)
			if _, err := r.Settle(ctx, actual); err != nil {
				t.Error(err)
			}
			used[i] = actual
		}()
	}
	wg.Wait()
	var total uint64
	for _, u := range used {
		total += u
	}
	d, err := onRedis.Peek(ctx, "hot", "tokens")
	if err != nil || d.Remaining != 10-min(total, 10) {
		t.Fatalf("books: %d used, %+v %v", total, d, err)
	}
}
