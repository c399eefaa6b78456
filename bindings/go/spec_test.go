package shardlimit

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// The sentinels, by the stable name of spec/errors.json.
var sentinels = map[string]*Error{
	"config":           ErrConfig,
	"invalid_argument": ErrInvalidArgument,
	"connection":       ErrConnection,
	"timeout":          ErrTimeout,
	"script":           ErrScript,
	"unknown_policy":   ErrUnknownPolicy,
	"io":               ErrIO,
	"internal":         ErrInternal,
	"unavailable":      ErrUnavailable,
	"overloaded":       ErrOverloaded,
}

// The codes, names, backend flags and hierarchy of spec/errors.json (generated from the
// core's ErrorKind) are Go's: a sentinel per kind, errors.Is following the parents.
func TestErrorsMatchTheSpec(t *testing.T) {
	var spec struct {
		Kinds []struct {
			Code    uint32  `json:"code"`
			Name    string  `json:"name"`
			Parent  *string `json:"parent"`
			Backend bool    `json:"backend"`
		} `json:"kinds"`
		Retired []struct {
			Code uint32 `json:"code"`
			Name string `json:"name"`
		} `json:"retired"`
	}
	readJSON(t, "../../spec/errors.json", &spec)
	if len(spec.Kinds) != len(sentinels) {
		t.Errorf("spec has %d kinds, Go %d sentinels", len(spec.Kinds), len(sentinels))
	}
	for _, k := range spec.Kinds {
		s, ok := sentinels[k.Name]
		if !ok {
			t.Errorf("no Go sentinel for %q", k.Name)
			continue
		}
		c := Code(k.Code)
		if s.Code != c || c.String() != k.Name || c.IsBackend() != k.Backend {
			t.Errorf("%s: sentinel code %d, name %q, backend %v; spec %d, %v", k.Name, s.Code, c.String(), c.IsBackend(), k.Code, k.Backend)
		}
		err := error(&Error{Code: c, Message: "m"})
		if !errors.Is(err, s) {
			t.Errorf("%s is not itself", k.Name)
		}
		if k.Parent == nil {
			if c.Parent() != 0 {
				t.Errorf("%s has parent %v, the spec none", k.Name, c.Parent())
			}
			continue
		}
		p := sentinels[*k.Parent]
		if p == nil || c.Parent() != p.Code || !errors.Is(err, p) {
			t.Errorf("%s: parent %v, spec %s; errors.Is(err, parent) %v", k.Name, c.Parent(), *k.Parent, errors.Is(err, p))
		}
		// and not the other way round
		if errors.Is(&Error{Code: p.Code}, s) {
			t.Errorf("%s is a %s", *k.Parent, k.Name)
		}
	}
	for _, r := range spec.Retired {
		if Code(r.Code).String() != "unknown" {
			t.Errorf("retired code %d (%s) still has the name %q", r.Code, r.Name, Code(r.Code).String())
		}
	}
	if !errors.Is(ErrUnknownPolicy, ErrInvalidArgument) || errors.Is(ErrInvalidArgument, ErrUnknownPolicy) {
		t.Error("ErrUnknownPolicy must be an ErrInvalidArgument, not the reverse")
	}
	// an unknown policy from a real call is both
	l, err := NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Check(context.Background(), "k", "nope", 1)
	if !errors.Is(err, ErrUnknownPolicy) || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown policy: %v", err)
	}
}

// Every case of tests/vectors/keys.json (hex, so invalid UTF-8 is written as it is) is
// accepted or refused as the vector says, with an invalid_argument naming `key`.
func TestKeyVectors(t *testing.T) {
	var v struct {
		Cases []struct {
			Name     string `json:"name"`
			Hex      string `json:"hex"`
			Accepted bool   `json:"accepted"`
		} `json:"cases"`
	}
	readJSON(t, "../../tests/vectors/keys.json", &v)
	if len(v.Cases) == 0 {
		t.Fatal("no cases")
	}
	l, err := NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := NewPolicy("keys", Limit{Algorithm: FixedWindow, Limit: 1000, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, c := range v.Cases {
		b, err := hex.DecodeString(c.Hex)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		d, err := l.CheckPolicy(context.Background(), string(b), p, 1)
		if c.Accepted {
			if err != nil || !d.Allowed {
				t.Errorf("%s: refused: %+v %v", c.Name, d, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "key") {
			t.Errorf("%s: want an invalid argument naming `key`, got %v", c.Name, err)
		}
	}
}

// The in-memory limiter decides on a manual clock, with ad-hoc and configured policies.
func TestMemoryLimiterWithManualClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock, err := NewManualClock(start)
	if err != nil {
		t.Fatal(err)
	}
	defer clock.Close()
	l, err := NewMemory(WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, err := NewPolicy("adhoc", Limit{Algorithm: FixedWindow, Limit: 2, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		d, err := l.CheckPolicy(ctx, "k", p, 1)
		if err != nil || d.Allowed != (i < 2) || d.Source != SourceMemory || d.Policy != "adhoc" {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
		if i == 2 && (!d.HasRetryAfter || d.RetryAfter != time.Second) {
			t.Fatalf("denied at the window's start: retry after %v", d.RetryAfter)
		}
	}
	if err := clock.Advance(time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := l.CheckPolicy(ctx, "k", p, 1); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("next window: %+v %v", d, err)
	}
	// a configured policy on the same clock, by name and as an object
	cl, err := NewFromJSON(`{"policies":{"tb":{"algorithm":"token_bucket","capacity":2,"refill_per_sec":1}}}`, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 2; i++ {
		if d, err := cl.Check(ctx, "k", "tb", 1); err != nil || !d.Allowed {
			t.Fatalf("tb %d: %+v %v", i, d, err)
		}
	}
	if d, _ := cl.Check(ctx, "k", "tb", 1); d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("empty bucket: %+v", d)
	}
	_ = clock.Advance(time.Second)
	tb, err := cl.Policy("tb")
	if err != nil || tb.Name() != "tb" {
		t.Fatalf("Policy: %v", err)
	}
	defer tb.Close()
	if d, err := cl.CheckPolicy(ctx, "k", tb, 1); err != nil || !d.Allowed {
		t.Fatalf("refilled: %+v %v", d, err)
	}
	if _, err := cl.Policy("nope"); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown: %v", err)
	}
	// bad limits are the core's errors, naming the field
	if _, err := NewPolicy("bad", Limit{Algorithm: FixedWindow, Limit: 0, Period: time.Second}); !errors.Is(err, ErrConfig) {
		t.Fatalf("limit 0: %v", err)
	}
	if _, err := NewPolicy("bad", Limit{Algorithm: 99, Limit: 1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("algorithm 99: %v", err)
	}
	// a closed clock or policy is an error, never a crash
	_ = p.Close()
	if _, err := l.CheckPolicy(ctx, "k", p, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed policy: %v", err)
	}
	c2, _ := NewManualClock(start)
	_ = c2.Close()
	if _, err := NewMemory(WithClock(c2)); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed clock: %v", err)
	}
}

// Every operation of spec/operations.json not marked not_in go is a Go method of
// *Limiter under its PascalCase name, or (constructors) one of the functions below.
func TestEveryOperationOfTheCore(t *testing.T) {
	var spec struct {
		Operations []struct {
			Name  string            `json:"name"`
			NotIn map[string]string `json:"not_in"`
		} `json:"operations"`
	}
	readJSON(t, "../../spec/operations.json", &spec)
	// operations that are not methods of *Limiter: the function values prove they exist
	functions := map[string]any{
		"release":          (*Lease).Release,
		"settle":           (*Reservation).Settle,
		"memory":           NewMemory,
		"new":              NewFromJSON,
		"from_config_file": NewFromFile,
		"from_env":         NewFromEnv,
		"with_clock":       WithClock,
		"set_log_sink":     WithLogger,
	}
	// operations Go does not offer yet (the C ABI lacks them); each must still be absent
	missing := map[string]bool{}
	methods := reflect.TypeOf(&Limiter{})
	pascal := func(op string) string {
		parts := strings.Split(op, "_")
		for i, p := range parts {
			parts[i] = strings.ToUpper(p[:1]) + p[1:]
		}
		return strings.Join(parts, "")
	}
	seen := 0
	for _, op := range spec.Operations {
		_, method := methods.MethodByName(pascal(op.Name))
		_, function := functions[op.Name]
		has := method || function
		switch {
		case op.NotIn["go"] != "":
			if has {
				t.Errorf("%s is marked not_in go (%s) but Go has it", op.Name, op.NotIn["go"])
			}
		case missing[op.Name]:
			seen++
			if has {
				t.Errorf("%s is listed missing but Go has it: take it off the list", op.Name)
			}
		case !has:
			t.Errorf("Go lacks the operation %s (a method %s or a constructor)", op.Name, pascal(op.Name))
		}
	}
	if seen != len(missing) {
		t.Errorf("the missing list names operations the spec does not have")
	}
}

func TestEngineReloadScaleHealthMetrics(t *testing.T) {
	clock, err := NewManualClock(time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer clock.Close()
	l, err := NewFromJSON(`{"policies":{"api":{"algorithm":"fixed_window","limit":4,"window":"1s"}}}`, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if l.IsRedis() {
		t.Fatal("in memory")
	}
	if _, err := l.Check(ctx, "k", "api", 1); err != nil {
		t.Fatal(err)
	}
	if n, ok, err := l.MemoryKeys(); err != nil || !ok || n < 1 {
		t.Fatalf("MemoryKeys %d %v %v", n, ok, err)
	}
	if _, _, err := l.Route("k"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Route in memory: %v", err)
	}
	if err := l.SetScale(0.5); err != nil || l.Scale() != 0.5 {
		t.Fatalf("SetScale: %v %v", err, l.Scale())
	}
	if d, _ := l.Check(ctx, "k2", "api", 1); d.Limit != 2 {
		t.Fatalf("scaled limit %d", d.Limit)
	}
	if err := l.SetScale(0.5, "nope"); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("SetScale unknown: %v", err)
	}
	if err := l.SetScale(1, "api"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ObserveHealth(0.1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no hook: %v", err)
	}
	if err := l.SetLatencyScale(100*time.Millisecond, 0.1); err != nil {
		t.Fatal(err)
	}
	if f, err := l.ObserveHealth(0.4); err != nil || f != 0.25 {
		t.Fatalf("ObserveHealth: %v %v", f, err)
	}
	_ = l.SetScale(1)
	if err := l.Reload(`{"policies":{"api":{"algorithm":"fixed_window","limit":9,"window":"1s"}}}`); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Check(ctx, "k3", "api", 1); d.Limit != 9 {
		t.Fatalf("reloaded limit %d", d.Limit)
	}
	if err := l.Reload(`{"policies":{"api":{"algorithm":"fixed_window","limit":0,"window":"1s"}}}`); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad reload: %v", err)
	}
	path := t.TempDir() + "/c.json"
	if err := os.WriteFile(path, []byte(`{"policies":{"api":{"algorithm":"fixed_window","limit":7,"window":"1s"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.ReloadFromFile(path); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Check(ctx, "k4", "api", 1); d.Limit != 7 {
		t.Fatalf("reloaded from file: limit %d", d.Limit)
	}
	m, err := l.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Policies []struct {
			Policy  string `json:"policy"`
			Allowed uint64 `json:"allowed"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(m, &parsed); err != nil || len(parsed.Policies) == 0 || parsed.Policies[0].Policy != "api" || parsed.Policies[0].Allowed < 1 {
		t.Fatalf("metrics %s: %v", m, err)
	}
	if text, err := l.MetricsPrometheus(); err != nil || !strings.Contains(text, `policy="api"`) {
		t.Fatalf("prometheus %q: %v", text, err)
	}
}
