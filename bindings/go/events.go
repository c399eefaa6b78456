package shardlimit

/*
#include <stdint.h>
#include <stdlib.h>
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// EventKind says what an Event reports.
type EventKind uint32

// The event kinds, from the C header.
const (
	// EventDenied: a check was denied by its limit (Event.Decision).
	EventDenied EventKind = C.SHARDLIMIT_EVENT_DENIED
	// EventBlocked: a check met the block list (AutoBlock false), or a denial put the
	// key on it (AutoBlock true).
	EventBlocked EventKind = C.SHARDLIMIT_EVENT_BLOCKED
	// EventFallback: a shard failed and the policy's on_error decided (Allowed); ErrorCode
	// and Detail say what failed.
	EventFallback EventKind = C.SHARDLIMIT_EVENT_FALLBACK
	// EventCircuit: a shard's circuit opened (CircuitOpen) or closed; Detail is the shard.
	EventCircuit EventKind = C.SHARDLIMIT_EVENT_CIRCUIT
	// EventShadowDenied: shadow mode; the limit would have denied this check, which was
	// allowed (Event.Decision).
	EventShadowDenied EventKind = C.SHARDLIMIT_EVENT_SHADOW_DENIED
	// EventNearLimit: an allowed check took the key across its policy's near_limit
	// fraction (Limit, Remaining).
	EventNearLimit EventKind = C.SHARDLIMIT_EVENT_NEAR_LIMIT
	// EventReloaded: the config was reloaded (Reload, ReloadFromFile, WatchConfig);
	// Detail lists the policies added, removed or changed, comma-separated.
	EventReloaded EventKind = C.SHARDLIMIT_EVENT_RELOADED
	// EventReloadRejected: a watched file changed but its config was refused (ErrorCode,
	// Detail); the old config stays in force.
	EventReloadRejected EventKind = C.SHARDLIMIT_EVENT_RELOAD_REJECTED
)

// String is the kind's stable name ("denied", "near_limit", "reloaded", ...), as every
// binding spells it.
func (k EventKind) String() string { return goStr(C.shardlimit_event_kind_name(C.uint32_t(k))) }

// Event is one event of the limiter. Fields a kind does not use are zero.
type Event struct {
	Kind          EventKind
	Policy        string
	Key           string
	Limit         uint64 // denied, shadow_denied, near_limit
	Remaining     uint64 // denied, shadow_denied, near_limit
	RetryAfter    time.Duration
	HasRetryAfter bool // denied, blocked
	AutoBlock     bool // blocked: by this denial (auto_block)
	Allowed       bool // fallback: whether on_error allowed the request
	CircuitOpen   bool // circuit: opened (true) or closed
	EngineChanged bool // reloaded: new connections were made
	ErrorCode     Code // fallback, reload_rejected
	// Decision is the check's decision (denied, shadow_denied), else nil.
	Decision *Decision
	// Detail is the error message (fallback, reload_rejected), the shard (circuit), or
	// the policies that changed (reloaded). At most 511 bytes (cut at a character).
	Detail string
}

func eventFromC(e *C.shardlimit_event) Event {
	bytes := func(p *C.char, n C.size_t) string { return C.GoStringN(p, C.int(n)) }
	ev := Event{
		Kind:          EventKind(e.kind),
		Policy:        bytes(&e.policy[0], e.policy_len),
		Key:           bytes(&e.key[0], e.key_len),
		Limit:         uint64(e.limit),
		Remaining:     uint64(e.remaining),
		RetryAfter:    time.Duration(e.retry_after_us) * time.Microsecond,
		HasRetryAfter: bool(e.has_retry_after),
		AutoBlock:     bool(e.auto_block),
		Allowed:       bool(e.allowed),
		CircuitOpen:   bool(e.circuit_open),
		EngineChanged: bool(e.engine_changed),
		ErrorCode:     Code(e.error_code),
		Detail:        bytes(&e.detail[0], e.detail_len),
	}
	if e.has_decision {
		d := decisionFromC(&e.decision, ev.Policy)
		ev.Decision = &d
	}
	return ev
}

// Subscribe delivers the limiter's events from now on (denials, blocks, fallbacks,
// circuit changes, shadow denials, near-limit crossings, reloads) on the returned
// channel, which is closed when ctx is done or the limiter is closed. Events wait in the
// library (up to 1024) while the channel is not read; beyond that they are dropped, so
// a slow reader never slows a check. One goroutine per subscription reads them; it holds
// no OS thread while it waits (the library wakes it through the completion queue of
// started calls), and ends when the channel closes.
func (l *Limiter) Subscribe(ctx context.Context) (<-chan Event, error) {
	h, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	if err := startDispatch(); err != nil {
		return nil, err
	}
	var sub *C.shardlimit_subscription
	var e *C.shardlimit_error
	if rc := C.shardlimit_subscribe(h.p, 0, &sub, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	user, id, wake := newWaker()
	if rc := C.shardlimit_subscription_set_notify(sub, goNotify, user, &e); rc != C.SHARDLIMIT_OK {
		C.shardlimit_subscription_free(sub)
		wakers.Delete(id)
		return nil, takeError(rc, e)
	}
	ch := make(chan Event)
	go func() {
		defer close(ch)
		defer wakers.Delete(id)
		defer C.shardlimit_subscription_free(sub)
		var ev C.shardlimit_event
		for {
			// drain what is queued without waiting, then park until notified: the
			// subscription notifies when it goes from empty to holding an event, and
			// when it closes (the limiter is gone)
			for {
				var got C.bool
				if rc := C.shardlimit_subscription_next(sub, 0, &got, &ev, nil); rc != C.SHARDLIMIT_OK {
					return // CLOSED: the limiter is gone
				}
				if !got {
					break
				}
				select {
				case ch <- eventFromC(&ev):
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// ConfigWatcher reloads a limiter when its config file changes, until it is closed (or
// its context is done).
type ConfigWatcher struct {
	mu     sync.Mutex
	w      *C.shardlimit_watcher
	closed chan struct{}
}

// WatchConfig reloads the limiter whenever the config file at path changes (its
// modification time is checked every `every`; 0 is one second). Each reload is an
// EventReloaded on Subscribe's channel: wait for it to know the next check uses the new
// file. A bad file is an EventReloadRejected and the old config stays. Watches until the
// watcher is closed, ctx is done, or the limiter is closed.
func (l *Limiter) WatchConfig(ctx context.Context, path string, every time.Duration) (*ConfigWatcher, error) {
	h, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	if every == 0 {
		every = time.Second
	}
	ms := every.Milliseconds()
	switch {
	case every < 0:
		ms = 0 // refused by the library, which names the value
	case ms < 1:
		ms = 1 // below a millisecond: as often as the library allows
	}
	pp, pn := cStr(path)
	var w *C.shardlimit_watcher
	var e *C.shardlimit_error
	if rc := C.shardlimit_watch_config(h.p, pp, pn, C.uint64_t(ms), &w, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	cw := &ConfigWatcher{w: w, closed: make(chan struct{})}
	runtime.SetFinalizer(cw, (*ConfigWatcher).Close)
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				_ = cw.Close()
			case <-cw.closed:
			}
		}()
	}
	return cw, nil
}

// Close stops watching; it returns once no reload can start any more (within one
// interval). Closing twice is a no-op.
func (w *ConfigWatcher) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w != nil {
		C.shardlimit_watcher_free(w.w)
		w.w = nil
		close(w.closed)
	}
	return nil
}

// Config is the configuration in force (after the last reload). Shard URLs are not in
// it: they may carry passwords.
type Config struct {
	Engine       string // "redis" or "memory"
	Shards       []string
	ClusterSeeds int // the Redis Cluster seed nodes (0: not a cluster)
	KeyPrefix    string
	Timeout      time.Duration
	OnError      string
	Instances    uint32
	Policies     []PolicyConfig // sorted by name
}

// PolicyConfig is one policy of a Config.
type PolicyConfig struct {
	Name      string
	Max       uint64
	OnError   string
	Shadow    bool
	Overrides bool
	Limits    []LimitConfig
}

// LimitConfig is one limit of a policy: windows have Limit and Window, buckets Capacity
// and RefillPerSec (token_bucket) or LeakPerSec (leaky_bucket), concurrency Max and
// LeaseTTL.
type LimitConfig struct {
	Algorithm    string
	Limit        uint64
	Window       time.Duration
	Capacity     uint64
	RefillPerSec float64
	LeakPerSec   float64
	Max          uint64
	LeaseTTL     time.Duration
}

// Config is the limiter's configuration in force.
func (l *Limiter) Config() (Config, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return Config{}, err
	}
	var s C.shardlimit_string
	var e *C.shardlimit_error
	if rc := C.shardlimit_config_json(h.p, &s, &e); rc != C.SHARDLIMIT_OK {
		return Config{}, takeError(rc, e)
	}
	defer C.shardlimit_string_free(&s)
	var raw struct {
		Engine    string   `json:"engine"`
		Shards    []string `json:"shards"`
		Cluster   *int     `json:"cluster"`
		KeyPrefix string   `json:"key_prefix"`
		TimeoutMs int64    `json:"timeout_ms"`
		OnError   string   `json:"on_error"`
		Instances uint32   `json:"instances"`
		Policies  []struct {
			Name      string `json:"name"`
			Max       uint64 `json:"max"`
			OnError   string `json:"on_error"`
			Shadow    bool   `json:"shadow"`
			Overrides bool   `json:"overrides"`
			Limits    []struct {
				Algorithm    string  `json:"algorithm"`
				Limit        uint64  `json:"limit"`
				WindowMs     int64   `json:"window_ms"`
				Capacity     uint64  `json:"capacity"`
				RefillPerSec float64 `json:"refill_per_sec"`
				LeakPerSec   float64 `json:"leak_per_sec"`
				Max          uint64  `json:"max"`
				LeaseTTLMs   int64   `json:"lease_ttl_ms"`
			} `json:"limits"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(C.GoBytes(unsafe.Pointer(s.ptr), C.int(s.len)), &raw); err != nil {
		return Config{}, err
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	c := Config{
		Engine:    raw.Engine,
		Shards:    raw.Shards,
		KeyPrefix: raw.KeyPrefix,
		Timeout:   ms(raw.TimeoutMs),
		OnError:   raw.OnError,
		Instances: raw.Instances,
	}
	if raw.Cluster != nil {
		c.ClusterSeeds = *raw.Cluster
	}
	for _, p := range raw.Policies {
		pc := PolicyConfig{Name: p.Name, Max: p.Max, OnError: p.OnError, Shadow: p.Shadow, Overrides: p.Overrides}
		for _, li := range p.Limits {
			pc.Limits = append(pc.Limits, LimitConfig{
				Algorithm: li.Algorithm, Limit: li.Limit, Window: ms(li.WindowMs),
				Capacity: li.Capacity, RefillPerSec: li.RefillPerSec, LeakPerSec: li.LeakPerSec,
				Max: li.Max, LeaseTTL: ms(li.LeaseTTLMs),
			})
		}
		c.Policies = append(c.Policies, pc)
	}
	return c, nil
}

// WithShadow is a copy of the policy in shadow mode (true) or enforcing (false): in
// shadow, a check the limit would deny is allowed (Decision.ShadowDenied), consumes
// nothing and is reported (EventShadowDenied, ShadowReport). The policy itself is
// unchanged. A concurrency policy cannot run in shadow (ErrInvalidArgument).
func (p *Policy) WithShadow(shadow bool) (*Policy, error) {
	ph, err := p.handle()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(p)
	var out *C.shardlimit_policy
	var e *C.shardlimit_error
	if rc := C.shardlimit_policy_with_shadow(ph, C.bool(shadow), &out, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	return wrapPolicy(out), nil
}
