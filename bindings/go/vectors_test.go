package shardlimit

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

type vectorStep struct {
	Op             string          `json:"op"`
	TUs            int64           `json:"t_us"`
	Key            string          `json:"key"`
	Cost           uint64          `json:"cost"`
	Lease          string          `json:"lease"`
	LeaseAs        string          `json:"lease_as"`
	ExpectReleased *bool           `json:"expect_released"`
	Expect         json.RawMessage `json:"expect"`
}

// replayVectors replays every case of tests/vectors/algorithms.json on a fresh limiter
// from config(policy, case index) deciding on a manual clock; an op it does not know
// fails the test.
func replayVectors(t *testing.T, config func(policy json.RawMessage, i int) string) {
	var doc struct {
		Cases []struct {
			Name   string          `json:"name"`
			Policy json.RawMessage `json:"policy"`
			Steps  []vectorStep    `json:"steps"`
		} `json:"cases"`
	}
	readJSON(t, "../../tests/vectors/algorithms.json", &doc)
	ctx := context.Background()
	steps := 0
	for i, c := range doc.Cases {
		clock, err := NewManualClock(time.UnixMicro(0))
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewFromJSON(config(c.Policy, i), WithClock(clock))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		leases := map[string]*Lease{}
		for j, s := range c.Steps {
			where := fmt.Sprintf("%s, step %d (%s)", c.Name, j, s.Op)
			if err := clock.Set(time.UnixMicro(s.TUs)); err != nil {
				t.Fatal(err)
			}
			switch s.Op {
			case "check":
				d, lease, err := l.Acquire(ctx, s.Key, "p", s.Cost)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if s.LeaseAs != "" && lease != nil {
					leases[s.LeaseAs] = lease
				}
				var retry *int64
				if d.HasRetryAfter {
					r := d.RetryAfter.Microseconds()
					retry = &r
				}
				got, _ := json.Marshal(map[string]any{
					"allowed":        d.Allowed,
					"remaining":      d.Remaining,
					"reset_after_us": d.ResetAfter.Microseconds(),
					"retry_after_us": retry,
					"delay_us":       d.Delay.Microseconds(),
				})
				var want, have map[string]any
				_ = json.Unmarshal(s.Expect, &want)
				_ = json.Unmarshal(got, &have)
				if fmt.Sprint(want) != fmt.Sprint(have) {
					t.Errorf("%s: got %s, want %s", where, got, s.Expect)
				}
			case "release":
				lease := leases[s.Lease]
				if lease == nil || s.ExpectReleased == nil {
					t.Fatalf("%s: no lease %q or no expect_released", where, s.Lease)
				}
				// (a second release of one lease expects false: Release answers false for a
				// lease it has released, without asking the core again)
				released, err := lease.Release(ctx)
				if err != nil || released != *s.ExpectReleased {
					t.Errorf("%s: released %v (%v), want %v", where, released, err, *s.ExpectReleased)
				}
			default:
				t.Fatalf("%s: unknown op %q: teach this replay the op", where, s.Op)
			}
			steps++
		}
		_ = l.Close()
		_ = clock.Close()
	}
	if steps < 30 {
		t.Fatalf("only %d steps", steps)
	}
}

func TestVectorsInMemory(t *testing.T) {
	replayVectors(t, func(policy json.RawMessage, _ int) string {
		return fmt.Sprintf(`{"policies":{"p":%s}}`, policy)
	})
}

func TestVectorsOnRedis(t *testing.T) {
	r := startRedis(t)
	replayVectors(t, func(policy json.RawMessage, i int) string {
		// a fresh key space per case
		return fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,
			"key_prefix":"vec%d","policies":{"p":%s}}`, r.Port, i, policy)
	})
}
