package shardlimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Multi-limit policies, plans and rate strings from Go: the core decides (one script call
// per check on Redis), the binding converts; the headers are the core's.
func TestMultiLimitPoliciesPlansAndRateStrings(t *testing.T) {
	const policies = `"api": "2/second; 3/minute"`
	for _, engine := range []string{"memory", "redis"} {
		t.Run(engine, func(t *testing.T) {
			clock, err := NewManualClock(time.Unix(1_700_006_400, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer clock.Close()
			cfg := `{"policies": {` + policies + `}}`
			if engine == "redis" {
				cfg = startRedis(t).config(policies)
			}
			cfg = strings.TrimSuffix(strings.TrimSpace(cfg), "}") + `, "plans": {"pro": {"api": "10/second; 100/minute"}}}`
			l, err := NewFromJSON(cfg, WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			d, err := l.Check(ctx, "u", "api", 2)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed || d.LimitIndex != 0 || len(d.Quotas) != 2 || d.Quotas[1] != (Quota{3, time.Minute}) {
				t.Fatalf("first check: %+v", d)
			}
			h, err := d.Headers()
			if err != nil {
				t.Fatal(err)
			}
			if !hasHeader(h, "RateLimit-Policy", `"api";q=2;w=1, "api#1";q=3;w=60`) {
				t.Fatalf("headers %v", h)
			}
			clock.Advance(time.Second)
			d, err = l.Check(ctx, "u", "api", 2)
			if err != nil || d.Allowed || d.LimitIndex != 1 || d.Limit != 3 {
				t.Fatalf("the minute denies: %+v %v", d, err)
			}
			h, _ = d.Headers()
			if !hasHeader(h, "RateLimit", `"api#1";r=1;t=59`) {
				t.Fatalf("headers %v", h)
			}
			// under a plan: the same name, so the same keys (the second kept its budget)
			pro, err := l.PlanPolicy("pro", "api")
			if err != nil {
				t.Fatal(err)
			}
			defer pro.Close()
			d, err = l.CheckPolicy(ctx, "u", pro, 2)
			if err != nil || !d.Allowed || d.Policy != "api" || d.Remaining != 8 || d.Quotas[0].Limit != 10 {
				t.Fatalf("under the plan: %+v %v", d, err)
			}
			if _, err := l.PlanPolicy("gold", "api"); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("an unknown plan: %v", err)
			}
			if _, err := l.PlanPolicy("pro", "nope"); !errors.Is(err, ErrUnknownPolicy) {
				t.Fatalf("an unknown policy: %v", err)
			}
			// ad-hoc rate strings
			burst, err := NewPolicyFromRate("", "1/second; 2/minute", FixedWindow)
			if err != nil {
				t.Fatal(err)
			}
			defer burst.Close()
			if burst.Name() != "fixed_window-1-1000ms--fixed_window-2-60000ms" {
				t.Fatalf("name %q", burst.Name())
			}
			for i, want := range []bool{true, false} {
				d, err = l.CheckPolicy(ctx, "a", burst, 1)
				if err != nil || d.Allowed != want || d.LimitIndex != 0 {
					t.Fatalf("ad hoc %d: %+v %v", i, d, err)
				}
			}
			single, err := NewPolicyFromRate("login", "5/minute", SlidingLog)
			if err != nil {
				t.Fatal(err)
			}
			defer single.Close()
			d, err = l.CheckPolicy(ctx, "a", single, 1)
			if err != nil || d.LimitIndex != -1 || d.Quotas != nil || d.Remaining != 4 {
				t.Fatalf("one limit: %+v %v", d, err)
			}
			_, err = NewPolicyFromRate("", "5/fortnight", FixedWindow)
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "fortnight") {
				t.Fatalf("a bad rate: %v", err)
			}
		})
	}
}

func hasHeader(h []Header, name, value string) bool {
	for _, x := range h {
		if x.Name == name && x.Value == value {
			return true
		}
	}
	return false
}
