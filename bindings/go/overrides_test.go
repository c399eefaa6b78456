package shardlimit

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"testing"
	"time"
)

const overridePolicies = `"api":{"algorithm":"fixed_window","limit":3,"window":"1h","overrides":true},
	"plain":{"algorithm":"fixed_window","limit":3,"window":"1h"}`

// Two limiters on one Redis are two processes: what one sets, the other's next check uses.
func TestOverridesOnRedis(t *testing.T) {
	s := startRedis(t)
	ctx := context.Background()
	a, err := NewFromJSON(s.config(overridePolicies))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewFromJSON(s.config(overridePolicies))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	check := func(key string) Decision {
		t.Helper()
		d, err := b.Check(ctx, key, "api", 1)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := check("acme"); d.Limit != 3 {
		t.Fatalf("before: %+v", d)
	}
	o, err := a.SetOverride(ctx, "acme", "api", "100/hour", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var lim map[string]any
	if err := json.Unmarshal(o.Limit, &lim); err != nil || lim["limit"] != 100.0 || o.Permanent || o.Remaining != time.Hour {
		t.Fatalf("set returned %+v (%v)", o, err)
	}
	if d := check("acme"); d.Limit != 100 || d.Remaining != 98 || d.Policy != "api" {
		t.Fatalf("the next check: %+v", d)
	}
	got, err := b.GetOverride(ctx, "acme", "api")
	if err != nil || got == nil || got.Key != "acme" || got.Remaining > time.Hour {
		t.Fatalf("get: %+v %v", got, err)
	}
	if none, err := b.GetOverride(ctx, "nobody", "api"); none != nil || err != nil {
		t.Fatalf("get of a key without one: %+v %v", none, err)
	}
	if _, err := a.SetOverride(ctx, "globex", "api", `{"limit": 7, "window": "1m"}`, 0); err != nil {
		t.Fatal(err)
	}
	var keys []string
	cursor := ""
	for {
		p, err := b.ListOverrides(ctx, "api", cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range p.Overrides {
			keys = append(keys, o.Key)
		}
		if p.Cursor == "" {
			break
		}
		cursor = p.Cursor
	}
	sort.Strings(keys)
	if len(keys) != 2 || keys[0] != "acme" || keys[1] != "globex" {
		t.Fatalf("list: %v", keys)
	}
	for _, want := range []bool{true, false} {
		if del, err := a.DeleteOverride(ctx, "acme", "api"); err != nil || del != want {
			t.Fatalf("delete: %v %v, want %v", del, err, want)
		}
	}
	if d := check("acme"); d.Limit != 3 {
		t.Fatalf("after delete: %+v", d)
	}
	// errors are typed: a policy without overrides, a plan name, an unknown policy
	if _, err := a.SetOverride(ctx, "acme", "plain", "5/minute", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("plain: %v", err)
	}
	if _, err := a.SetOverride(ctx, "acme", "api", "gold", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("plan name: %v", err)
	}
	if _, err := a.SetOverride(ctx, "acme", "nope", "5/minute", 0); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := a.SetOverride(ctx, "acme", "api", "5/minute", -time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative ttl: %v", err)
	}
}
