package shardlimit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// vectorItem is one step of tests/vectors/algorithms.json, or one item of a batch step
// (format: the `format` list at the top of the file).
type vectorItem struct {
	Op             string          `json:"op"`
	TUs            *int64          `json:"t_us"`
	Key            string          `json:"key"`
	Policy         string          `json:"policy"`
	Plan           string          `json:"plan"`
	Cost           uint64          `json:"cost"`
	Units          uint64          `json:"units"`
	LeaseAs        string          `json:"lease_as"`
	Lease          string          `json:"lease"`
	ExpectReleased *bool           `json:"expect_released"`
	Layers         []vectorLayer   `json:"layers"`
	Items          []vectorItem    `json:"items"`
	Expect         json.RawMessage `json:"expect"`
	// settle.json's ops
	ReserveAs   string `json:"reserve_as"`
	Reservation string `json:"reservation"`
	Actual      uint64 `json:"actual"`
	// shadow.json: a check in shadow mode (CheckShadow), and the shadow_report op
	Shadow       bool            `json:"shadow"`
	Top          int             `json:"top"`
	ExpectReport json.RawMessage `json:"expect_report"`
	// overrides.json's ops
	Limit         string `json:"limit"`
	TTLMs         *int64 `json:"ttl_ms"`
	ExpectDeleted *bool  `json:"expect_deleted"`
}

type vectorLayer struct {
	Key    string `json:"key"`
	Policy string `json:"policy"`
	Cost   uint64 `json:"cost"`
}

// vectorDecision is a decision as the vectors write it: durations in whole µs,
// retry_after_us null when absent, layer null but for check_all.
type vectorDecision struct {
	Allowed      bool   `json:"allowed"`
	Limit        uint64 `json:"limit"`
	Remaining    uint64 `json:"remaining"`
	ResetAfterUs int64  `json:"reset_after_us"`
	RetryAfterUs *int64 `json:"retry_after_us"`
	DelayUs      int64  `json:"delay_us"`
	Policy       string `json:"policy"`
	Layer        *int   `json:"layer"`
	// multi-limit policies (plans.json): the deciding limit and RateLimit-Policy
	LimitIndex      *int   `json:"limit_index,omitempty"`
	RateLimitPolicy string `json:"rate_limit_policy,omitempty"`
	// shadow.json: written only when true
	ShadowDenied bool `json:"shadow_denied,omitempty"`
}

type vectorCase struct {
	Name     string                     `json:"name"`
	Policies map[string]json.RawMessage `json:"policies"`
	Steps    []vectorItem               `json:"steps"`
	// plans.json: the config's plans and default_algorithm beside the policies
	Plans            json.RawMessage `json:"plans"`
	DefaultAlgorithm string          `json:"default_algorithm"`
	// the file it is read from (for the failure messages)
	File string `json:"-"`
}

var vectorOps = map[string]bool{"check": true, "peek": true, "acquire": true, "release": true,
	"reset": true, "check_all": true, "batch": true,
	"charge": true, "refund": true, "reserve": true, "settle": true,
	"shadow_report": true, "set_override": true, "delete_override": true}

// vectorFiles are the decision files of tests/vectors, every one replayed in full.
var vectorFiles = []string{"algorithms.json", "plans.json", "precision.json", "settle.json",
	"shadow.json", "overrides.json"}

// otherVectorFiles are the other files of tests/vectors and the test replaying each.
var otherVectorFiles = map[string]string{
	"keys.json":    "TestKeyVectors (spec_test.go)",
	"routing.json": "TestRoutingVectors (every case among 1 to 16 shards)",
}

// skippedVectorFiles: files no Go test replays, with the reason (none today).
var skippedVectorFiles = map[string]string{}

func observedDecision(d Decision) vectorDecision {
	v := vectorDecision{
		Allowed:      d.Allowed,
		Limit:        d.Limit,
		Remaining:    d.Remaining,
		ResetAfterUs: d.ResetAfter.Microseconds(),
		DelayUs:      d.Delay.Microseconds(),
		Policy:       d.Policy,
		ShadowDenied: d.ShadowDenied,
	}
	if d.HasRetryAfter {
		r := d.RetryAfter.Microseconds()
		v.RetryAfterUs = &r
	}
	if d.Layer >= 0 {
		layer := d.Layer
		v.Layer = &layer
	}
	if d.LimitIndex >= 0 {
		i := d.LimitIndex
		v.LimitIndex = &i
		h, _ := d.Headers()
		for _, x := range h {
			if x.Name == "RateLimit-Policy" {
				v.RateLimitPolicy = x.Value
			}
		}
	}
	return v
}

func readVectors(t *testing.T) []vectorCase {
	t.Helper()
	var cases []vectorCase
	for _, f := range vectorFiles {
		var doc struct {
			Cases []vectorCase `json:"cases"`
		}
		readJSON(t, repoPath(t, "tests/vectors/"+f), &doc)
		if len(doc.Cases) == 0 {
			t.Fatalf("no cases in %s", f)
		}
		for i := range doc.Cases {
			doc.Cases[i].File = f
		}
		cases = append(cases, doc.Cases...)
	}
	return cases
}

// vectorReplay is one case's limiter and the leases kept by name (lease_as).
type vectorReplay struct {
	t            *testing.T
	l            *Limiter
	source       Source
	leases       map[string]*Lease
	reservations map[string]*Reservation
}

// decided compares every field of the expectation, and the source (never fallback).
func (r *vectorReplay) decided(where string, it vectorItem, d Decision, lease *Lease) {
	r.t.Helper()
	// every field of expect, no more, no fewer
	var fields map[string]json.RawMessage
	err := json.Unmarshal(it.Expect, &fields)
	n := len(fields)
	if _, ok := fields["shadow_denied"]; ok {
		n--
	}
	if err != nil || (n != 8 && n != 10) {
		r.t.Fatalf("%s: expect %s is not the 8 (10: multi-limit) fields of a decision, with shadow_denied when true (%v)", where, it.Expect, err)
	}
	var want vectorDecision
	dec := json.NewDecoder(bytes.NewReader(it.Expect))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&want); err != nil {
		r.t.Fatalf("%s: expect %s: %v", where, it.Expect, err)
	}
	if d.Source != r.source {
		r.t.Errorf("%s: decided by %v, want %v", where, d.Source, r.source)
	}
	if got := observedDecision(d); !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		r.t.Errorf("%s: got %s, want %s", where, g, it.Expect)
	}
	if it.LeaseAs != "" {
		if lease == nil {
			r.t.Fatalf("%s: no lease to keep as %q", where, it.LeaseAs)
		}
		r.leases[it.LeaseAs] = lease
	}
}

// call runs a check, peek or acquire (a step or a batch item).
func (r *vectorReplay) call(ctx context.Context, where string, it vectorItem) {
	r.t.Helper()
	var d Decision
	var lease *Lease
	var err error
	var planned *Policy
	if it.Plan != "" {
		if planned, err = r.l.PlanPolicy(it.Plan, it.Policy); err != nil {
			r.t.Fatalf("%s: %v", where, err)
		}
		defer planned.Close()
	}
	switch {
	case it.Op == "check" && it.Shadow && planned != nil:
		// a finding, not a skip: CheckShadow takes a policy name; no vector has this today
		r.t.Fatalf("%s: Go cannot make a shadow check under a plan (CheckShadow takes a policy name)", where)
	case it.Op == "check" && planned != nil:
		d, err = r.l.CheckPolicy(ctx, it.Key, planned, it.Cost)
	case it.Op == "peek" && planned != nil:
		d, err = r.l.PeekPolicy(ctx, it.Key, planned)
	case it.Op == "check" && it.Shadow:
		d, err = r.l.CheckShadow(ctx, it.Key, it.Policy, it.Cost)
	case it.Op == "check":
		d, err = r.l.Check(ctx, it.Key, it.Policy, it.Cost)
	case it.Op == "peek":
		d, err = r.l.Peek(ctx, it.Key, it.Policy)
	case it.Op == "acquire":
		d, lease, err = r.l.Acquire(ctx, it.Key, it.Policy, it.Units)
	default:
		r.t.Fatalf("%s: op %q cannot be a batch item", where, it.Op)
	}
	if err != nil {
		r.t.Fatalf("%s: %v", where, err)
	}
	r.decided(where, it, d, lease)
}

func (r *vectorReplay) step(ctx context.Context, where string, s vectorItem) {
	r.t.Helper()
	switch s.Op {
	case "check", "peek", "acquire":
		r.call(ctx, where, s)
	case "batch":
		if len(s.Items) == 0 {
			r.t.Fatalf("%s: a batch without items", where)
		}
		// one after another, in order, at the step's t_us: calls issued concurrently
		// would have no order, and the items' decisions depend on it
		for j, it := range s.Items {
			if it.TUs != nil {
				r.t.Fatalf("%s, item %d: a batch item has no t_us of its own", where, j)
			}
			r.call(ctx, fmt.Sprintf("%s, item %d (%s)", where, j, it.Op), it)
		}
	case "release":
		lease := r.leases[s.Lease]
		if lease == nil || s.ExpectReleased == nil {
			r.t.Fatalf("%s: no lease %q or no expect_released", where, s.Lease)
		}
		released, err := lease.Release(ctx)
		if err != nil || released != *s.ExpectReleased {
			r.t.Errorf("%s: released %v (%v), want %v", where, released, err, *s.ExpectReleased)
		}
	case "reset":
		if err := r.l.Reset(ctx, s.Key, s.Policy); err != nil {
			r.t.Fatalf("%s: %v", where, err)
		}
	case "check_all":
		layers := make([]Layer, len(s.Layers))
		for i, x := range s.Layers {
			layers[i] = Layer{Key: x.Key, Policy: x.Policy, Cost: x.Cost}
		}
		d, err := r.l.CheckAll(ctx, layers)
		if err != nil {
			r.t.Fatalf("%s: %v", where, err)
		}
		r.decided(where, s, d, nil)
	case "charge", "refund", "reserve", "settle":
		if s.Plan != "" {
			// a finding, not a skip: Charge, Refund and Reserve take a policy name; no
			// vector has such a step today
			r.t.Fatalf("%s: Go cannot %s under a plan (it takes a policy name only)", where, s.Op)
		}
		var d Decision
		var err error
		switch s.Op {
		case "charge":
			d, err = r.l.Charge(ctx, s.Key, s.Policy, s.Cost)
		case "refund":
			d, err = r.l.Refund(ctx, s.Key, s.Policy, s.Cost)
		case "reserve":
			var res *Reservation
			d, res, err = r.l.Reserve(ctx, s.Key, s.Policy, s.Cost)
			if s.ReserveAs != "" {
				if res == nil {
					r.t.Fatalf("%s: no reservation to keep as %q", where, s.ReserveAs)
				}
				r.reservations[s.ReserveAs] = res
			}
		default:
			res := r.reservations[s.Reservation]
			if res == nil {
				r.t.Fatalf("%s: no reservation %q", where, s.Reservation)
			}
			d, err = res.Settle(ctx, s.Actual)
		}
		if err != nil {
			r.t.Fatalf("%s: %v", where, err)
		}
		r.decided(where, s, d, nil)
	case "shadow_report":
		got, err := r.l.ShadowReport(ctx, s.Policy, s.Top)
		if err != nil {
			r.t.Fatalf("%s: %v", where, err)
		}
		var want ShadowReport
		dec := json.NewDecoder(bytes.NewReader(s.ExpectReport))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			r.t.Fatalf("%s: expect_report %s: %v", where, s.ExpectReport, err)
		}
		if len(want.Keys) == 0 {
			want.Keys = got.Keys[:0:0]
		}
		if !reflect.DeepEqual(got, want) {
			r.t.Errorf("%s: report %+v, want %s", where, got, s.ExpectReport)
		}
	case "set_override":
		var ttl time.Duration
		if s.TTLMs != nil {
			ttl = time.Duration(*s.TTLMs) * time.Millisecond
		}
		if _, err := r.l.SetOverride(ctx, s.Key, s.Policy, s.Limit, ttl); err != nil {
			r.t.Fatalf("%s: %v", where, err)
		}
	case "delete_override":
		if s.ExpectDeleted == nil {
			r.t.Fatalf("%s: no expect_deleted", where)
		}
		deleted, err := r.l.DeleteOverride(ctx, s.Key, s.Policy)
		if err != nil || deleted != *s.ExpectDeleted {
			r.t.Errorf("%s: deleted %v (%v), want %v", where, deleted, err, *s.ExpectDeleted)
		}
	default:
		r.t.Fatalf("%s: unknown op %q: teach this replay the op", where, s.Op)
	}
}

// replayVectors replays every case and every step of every file of vectorFiles on a
// fresh limiter from config(policies, case index) deciding on a manual clock set to each
// step's t_us; it returns the number of steps replayed.
func replayVectors(t *testing.T, source Source, config func(policies string, i int) string, opts ...Option) int {
	ctx := context.Background()
	steps := 0
	for i, c := range readVectors(t) {
		clock, err := NewManualClock(time.UnixMicro(0))
		if err != nil {
			t.Fatal(err)
		}
		policies, err := json.Marshal(c.Policies)
		if err != nil {
			t.Fatal(err)
		}
		// plans.json: the config's fields beside "policies", appended to its value
		if c.Plans != nil {
			policies = append(policies, `,"plans":`...)
			policies = append(policies, c.Plans...)
		}
		if c.DefaultAlgorithm != "" {
			policies = append(policies, fmt.Sprintf(`,"default_algorithm":%q`, c.DefaultAlgorithm)...)
		}
		l, err := NewFromJSON(config(string(policies), i), append([]Option{WithClock(clock)}, opts...)...)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		r := &vectorReplay{t: t, l: l, source: source, leases: map[string]*Lease{}, reservations: map[string]*Reservation{}}
		for j, s := range c.Steps {
			where := fmt.Sprintf("%s: %s, step %d (%s)", c.File, c.Name, j, s.Op)
			if s.TUs == nil {
				t.Fatalf("%s: no t_us", where)
			}
			if err := clock.Set(time.UnixMicro(*s.TUs)); err != nil {
				t.Fatal(err)
			}
			r.step(ctx, where, s)
			steps++
		}
		_ = l.Close()
		_ = clock.Close()
	}
	return steps
}

func totalVectorSteps(t *testing.T) int {
	n := 0
	for _, c := range readVectors(t) {
		n += len(c.Steps)
	}
	return n
}

func TestVectorsCoverEveryOp(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range readVectors(t) {
		for _, s := range c.Steps {
			seen[s.Op] = true
		}
	}
	if !reflect.DeepEqual(seen, vectorOps) {
		t.Fatalf("ops in the vectors: %v, want %v", seen, vectorOps)
	}
	if n := totalVectorSteps(t); n < 100 {
		t.Fatalf("only %d steps", n)
	}
}

// A new file in tests/vectors fails here until a Go test replays it or it is skipped with
// a reason, so that no vector file is silently ignored by the Go binding.
func TestEveryVectorFileIsReplayedOrSkipped(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(repoPath(t, "tests/vectors"), "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no vector files (%v)", err)
	}
	known := map[string]bool{}
	for _, f := range vectorFiles {
		known[f] = true
	}
	for f := range otherVectorFiles {
		known[f] = true
	}
	for f, why := range skippedVectorFiles {
		if why == "" {
			t.Errorf("%s is skipped without a reason", f)
		}
		known[f] = true
	}
	present := map[string]bool{}
	for _, p := range paths {
		present[filepath.Base(p)] = true
		if !known[filepath.Base(p)] {
			t.Errorf("tests/vectors/%s is neither replayed by a Go test nor skipped with a reason", filepath.Base(p))
		}
	}
	var listed []string
	for f := range known {
		listed = append(listed, f)
	}
	sort.Strings(listed)
	for _, f := range listed {
		if !present[f] {
			t.Errorf("%s is listed but not in tests/vectors", f)
		}
	}
	if _, err := os.Stat(repoPath(t, "tests/vectors/README.md")); err != nil {
		t.Errorf("tests/vectors/README.md documents the step formats: %v", err)
	}
}

func TestVectorsInMemory(t *testing.T) {
	n := replayVectors(t, SourceMemory, func(policies string, _ int) string {
		return fmt.Sprintf(`{"policies":%s}`, policies)
	})
	if want := totalVectorSteps(t); n != want {
		t.Fatalf("replayed %d steps of %d", n, want)
	}
}

func TestVectorsOnRedis(t *testing.T) {
	r := startRedis(t)
	n := replayVectors(t, SourceRedis, func(policies string, i int) string {
		// a fresh key space per case
		return fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,
			"key_prefix":"vec%d:","policies":%s}`, r.Port, i, policies)
	})
	if want := totalVectorSteps(t); n != want {
		t.Fatalf("replayed %d steps of %d", n, want)
	}
}

// The routing contract (tests/vectors/routing.json): every case's shard among 1 to 16
// shards, as Route reports it (shard names s0, s1, ...).
func TestRoutingVectors(t *testing.T) {
	r := startRedis(t)
	var doc struct {
		Cases []struct {
			Key      string `json:"key"`
			ShardFor []int  `json:"shard_for"`
		} `json:"cases"`
	}
	readJSON(t, repoPath(t, "tests/vectors/routing.json"), &doc)
	if len(doc.Cases) == 0 {
		t.Fatal("no routing cases")
	}
	for n := 1; n <= 16; n++ {
		shards := make([]string, n)
		for i := range shards {
			shards[i] = fmt.Sprintf(`{"name":"s%d","url":"redis://127.0.0.1:%d"}`, i, r.Port)
		}
		cfg := fmt.Sprintf(`{"shards":[%s],"policies":{}}`, strings.Join(shards, ","))
		l, err := NewFromJSON(cfg)
		if err != nil {
			t.Fatalf("%d shards: %v", n, err)
		}
		for _, c := range doc.Cases {
			idx, name, err := l.Route(c.Key)
			want := c.ShardFor[n-1]
			if err != nil || idx != want || name != fmt.Sprintf("s%d", want) {
				t.Errorf("key %q among %d shards: %d %q (%v), want %d", c.Key, n, idx, name, err, want)
			}
		}
		_ = l.Close()
	}
}

// precision.json's offsets (the per-key window offset function) through decisions: at a
// multiple of the window, a per_key fixed window of window_us resets for the key in
// exactly offset_us (a whole window when the offset is 0), on both engines.
func TestWindowOffsetVectors(t *testing.T) {
	var doc struct {
		Offsets []struct {
			Key      string `json:"key"`
			WindowUs int64  `json:"window_us"`
			OffsetUs int64  `json:"offset_us"`
		} `json:"offsets"`
	}
	readJSON(t, repoPath(t, "tests/vectors/precision.json"), &doc)
	if len(doc.Offsets) < 64 {
		t.Fatalf("only %d offsets", len(doc.Offsets))
	}
	policies := map[string]map[string]any{}
	for _, o := range doc.Offsets {
		policies[fmt.Sprintf("w%d", o.WindowUs)] = map[string]any{"algorithm": "fixed_window",
			"limit": 1, "window": fmt.Sprintf("%dus", o.WindowUs), "window_offset": "per_key"}
	}
	text, err := json.Marshal(policies)
	if err != nil {
		t.Fatal(err)
	}
	r := startRedis(t)
	for _, cfg := range []string{
		fmt.Sprintf(`{"policies":%s}`, text),
		fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,
			"key_prefix":"offsets:","policies":%s}`, r.Port, text),
	} {
		clock, err := NewManualClock(time.UnixMicro(0))
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewFromJSON(cfg, WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range doc.Offsets {
			w := o.WindowUs
			// the first multiple of the window after 1.7e15 µs
			if err := clock.Set(time.UnixMicro((1_700_000_000_000_000/w + 1) * w)); err != nil {
				t.Fatal(err)
			}
			d, err := l.Check(context.Background(), o.Key, fmt.Sprintf("w%d", w), 1)
			want := o.OffsetUs
			if want == 0 {
				want = w
			}
			if err != nil || !d.Allowed || d.ResetAfter.Microseconds() != want {
				t.Errorf("%q in a window of %d µs: %+v (%v), want a reset in %d µs", o.Key, w, d, err, want)
			}
		}
		_ = l.Close()
		_ = clock.Close()
	}
}
