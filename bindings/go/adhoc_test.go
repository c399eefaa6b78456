package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A Period the core cannot represent (it counts whole milliseconds) is refused, naming
// the field, instead of being truncated: 500µs became a period of 0.
func TestNewPolicyRefusesAPeriodThatIsNotWholeMilliseconds(t *testing.T) {
	for _, period := range []time.Duration{500 * time.Microsecond, 1500 * time.Microsecond, time.Nanosecond} {
		_, err := NewPolicy("p", Limit{Algorithm: FixedWindow, Limit: 5, Period: period})
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "limit.Period") {
			t.Errorf("Period %v: %v, want ErrInvalidArgument naming limit.Period", period, err)
		}
	}
	p, err := NewPolicy("p", Limit{Algorithm: FixedWindow, Limit: 5, Period: 2 * time.Millisecond})
	if err != nil {
		t.Fatalf("Period 2ms: %v", err)
	}
	_ = p.Close()
}

// An ad-hoc policy's key can be reset like a configured one's (Reset takes a name, which
// an ad-hoc policy is not in the config under).
func TestResetPolicyResetsAnAdHocPolicy(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":5,"window":"1h","on_error":"error"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for _, p := range []func() (*Policy, error){
		func() (*Policy, error) {
			return NewPolicy("adhoc", Limit{Algorithm: FixedWindow, Limit: 2, Period: time.Hour, OnError: OnErrorError})
		},
		func() (*Policy, error) { return NewPolicyFromRate("", "2/hour", FixedWindow) },
	} {
		pol, err := p()
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if d, err := l.CheckPolicy(ctx, "k", pol, 1); err != nil || !d.Allowed {
				t.Fatalf("%s check %d: %+v %v", pol.Name(), i, d, err)
			}
		}
		if d, err := l.CheckPolicy(ctx, "k", pol, 1); err != nil || d.Allowed {
			t.Fatalf("%s: the third check: %+v %v, want denied", pol.Name(), d, err)
		}
		if err := l.ResetPolicy(ctx, "k", pol); err != nil {
			t.Fatal(err)
		}
		if d, err := l.CheckPolicy(ctx, "k", pol, 1); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%s after ResetPolicy: %+v %v, want allowed with 1 left", pol.Name(), d, err)
		}
		_ = pol.Close()
	}
}

// AllowAtMost takes what is free, up to n (redis_rate's): 3 of 5, then the last 2 of a
// request for 3, then nothing.
func TestAllowAtMostTakesWhatIsFree(t *testing.T) {
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":5,"window":"1h","on_error":"error"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	var got []uint64
	for i := 0; i < 3; i++ {
		n, d, err := l.AllowAtMost(ctx, "k", "api", 3)
		if err != nil {
			t.Fatal(err)
		}
		if (n > 0) != d.Allowed || d.Source != SourceRedis {
			t.Fatalf("take %d: %d units but %+v", i, n, d)
		}
		got = append(got, n)
	}
	if fmt.Sprint(got) != "[3 2 0]" {
		t.Fatalf("took %v, want [3 2 0]", got)
	}
	if _, _, err := l.AllowAtMost(ctx, "k", "api", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("n = 0: %v", err)
	}
}
