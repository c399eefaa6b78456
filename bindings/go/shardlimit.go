// Package shardlimit is an idiomatic Go wrapper over the shardlimit C ABI
// (include/shardlimit.h, libshardlimit): distributed rate limiting shared with Rust,
// Python and Node services through the same Redis shards and config.
//
// It links the shardlimit C/C++ SDK through pkg-config (install the SDK and put its
// lib/pkgconfig on PKG_CONFIG_PATH; see bindings/go/README.md). By default it links
// libshardlimit.a statically (pkg-config module shardlimit-static, link_static.go), so
// the Go binary runs without libshardlimit.so; build with -tags shardlimit_dynamic to
// link libshardlimit.so instead (pkg-config module shardlimit, link_dynamic.go).
//
// A Limiter is safe for concurrent use by many goroutines. A call that talks to Redis
// starts on the library's I/O runtime and parks its goroutine on a channel, as a network
// read would: no OS thread is held while it waits, and it returns ctx.Err() as soon as
// ctx is cancelled or its deadline passes (the config's timeout_ms bounds it too).
package shardlimit

/*
#include <stdlib.h>
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Code is a stable shardlimit result code, shared with every binding.
type Code uint32

// The result codes, taken from the C header (which mirrors the core's error kinds).
const (
	CodeConfig          Code = C.SHARDLIMIT_ERR_CONFIG
	CodeInvalidArgument Code = C.SHARDLIMIT_ERR_INVALID_ARGUMENT
	CodeConnection      Code = C.SHARDLIMIT_ERR_CONNECTION
	CodeTimeout         Code = C.SHARDLIMIT_ERR_TIMEOUT
	CodeScript          Code = C.SHARDLIMIT_ERR_SCRIPT
	CodeUnknownPolicy   Code = C.SHARDLIMIT_ERR_UNKNOWN_POLICY
	CodeIO              Code = C.SHARDLIMIT_ERR_IO
	CodeInternal        Code = C.SHARDLIMIT_ERR_INTERNAL
	CodeUnavailable     Code = C.SHARDLIMIT_ERR_UNAVAILABLE
	CodeOverloaded      Code = C.SHARDLIMIT_ERR_OVERLOADED
	// CodeClosed: the handle was freed (a call racing Close); the C ABI's own code.
	CodeClosed Code = C.SHARDLIMIT_ERR_CLOSED
	// CodeCancelled: a started call was cancelled; the C ABI's own code. Go calls return
	// ctx.Err() instead.
	CodeCancelled Code = C.SHARDLIMIT_ERR_CANCELLED
)

// Parent is the more general code c is a special case of (CodeUnknownPolicy is a
// CodeInvalidArgument), or 0: the hierarchy of spec/errors.json, from the core.
func (c Code) Parent() Code { return Code(C.shardlimit_result_parent(C.uint32_t(c))) }

// String is the code's stable snake_case name ("config", "timeout", ...).
func (c Code) String() string { return goStr(C.shardlimit_result_name(C.uint32_t(c))) }

// IsBackend reports whether the code means "Redis failed" (connection, timeout, script,
// unavailable)
// rather than a caller mistake: the failures a service may choose to fail open on.
func (c Code) IsBackend() bool { return bool(C.shardlimit_result_is_backend(C.uint32_t(c))) }

// Error is a failure reported by shardlimit. Compare with errors.Is against the ErrXxx
// sentinels, or read Code.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "shardlimit: " + e.Code.String()
	}
	return "shardlimit: " + e.Message
}

// Is matches the sentinel of the same code or of a more general one, so
// errors.Is(err, ErrTimeout) works and an unknown policy is also an invalid argument
// (errors.Is(err, ErrInvalidArgument)), as in every binding.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Message != "" {
		return false
	}
	// a code's ancestors: the chain is short (one level today) and ends at 0
	for c, n := e.Code, 0; c != 0 && n < 8; c, n = c.Parent(), n+1 {
		if c == t.Code {
			return true
		}
	}
	return false
}

// IsBackend reports whether Redis failed (see Code.IsBackend).
func (e *Error) IsBackend() bool { return e.Code.IsBackend() }

// Sentinels for errors.Is.
var (
	ErrConfig          = &Error{Code: CodeConfig}
	ErrInvalidArgument = &Error{Code: CodeInvalidArgument}
	ErrConnection      = &Error{Code: CodeConnection}
	ErrTimeout         = &Error{Code: CodeTimeout}
	ErrScript          = &Error{Code: CodeScript}
	ErrUnknownPolicy   = &Error{Code: CodeUnknownPolicy}
	ErrIO              = &Error{Code: CodeIO}
	ErrInternal        = &Error{Code: CodeInternal}
	ErrUnavailable     = &Error{Code: CodeUnavailable}
	// ErrOverloaded: more checks wait for a shard's connection in this process than its
	// queue holds (max_queue); the check was neither admitted nor sent to on_error.
	ErrOverloaded = &Error{Code: CodeOverloaded}
	// ErrClosed is returned by calls on a Limiter after Close, including calls that race
	// Close on other goroutines (the library then reports CodeClosed).
	ErrClosed = &Error{Code: CodeClosed}
)

// takeError converts a failed call's result code and error object, freeing the object.
func takeError(rc C.shardlimit_result, e *C.shardlimit_error) error {
	msg := ""
	if e != nil {
		msg = goStr(C.shardlimit_error_message(e))
		C.shardlimit_error_free(e)
	}
	return &Error{Code: Code(rc), Message: msg}
}

func goStr(s C.shardlimit_str) string { return C.GoStringN(s.ptr, C.int(s.len)) }

// cStr passes a Go string to C as pointer + length without copying: the C side reads it
// only during the call and never retains it. An empty string passes (NULL, 0).
func cStr(s string) (*C.char, C.size_t) {
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s))
}

// Source says who made a decision.
type Source uint32

// The decision sources, from the C header.
const (
	SourceRedis    Source = C.SHARDLIMIT_SOURCE_REDIS
	SourceMemory   Source = C.SHARDLIMIT_SOURCE_MEMORY
	SourceLocal    Source = C.SHARDLIMIT_SOURCE_LOCAL
	SourceFallback Source = C.SHARDLIMIT_SOURCE_FALLBACK
	SourceBlock    Source = C.SHARDLIMIT_SOURCE_BLOCK
	// SourceLocalFallback: the shard failed and on_error: local decided with this
	// process's share of the limit; a denial is a rate limit (429), not an outage.
	SourceLocalFallback Source = C.SHARDLIMIT_SOURCE_LOCAL_FALLBACK
)

func (s Source) String() string { return goStr(C.shardlimit_source_name(C.uint32_t(s))) }

// Decision is the outcome of one check. A denied check consumed nothing.
type Decision struct {
	Allowed   bool
	Limit     uint64 // the effective limit
	Remaining uint64 // units still available
	// ResetAfter is the time until the full budget is back with no further traffic.
	ResetAfter time.Duration
	// RetryAfter is, when HasRetryAfter, the earliest time the same check could pass.
	RetryAfter time.Duration
	// HasRetryAfter is false when allowed, and when the cost can never fit.
	HasRetryAfter bool
	Delay         time.Duration // leaky bucket: wait this long before sending
	Window        time.Duration // the window the limit is measured over
	Policy        string        // the policy that decided
	Source        Source
	Shard         int // the Redis shard that decided, or -1
	// Layer is, for CheckAll, the index of the layer this decision describes (the one
	// that denied, or the tightest when all allowed); -1 for single checks.
	Layer int
	// ShadowDenied is true when the limit would have denied this check but its policy
	// (or the call: CheckShadow) is in shadow mode: Allowed is true and nothing was
	// consumed. Its headers do not say the client is limited.
	ShadowDenied bool
	// LimitIndex is, for a multi-limit policy, the index of the limit this decision
	// describes (the one that denied, or the tightest when all allowed); -1 otherwise.
	LimitIndex int
	// Quotas are a multi-limit policy's limits in force, in order (what RateLimit-Policy
	// lists: Headers renders them); nil for a policy of one limit.
	Quotas []Quota

	raw C.shardlimit_decision // for rendering headers and body in the core
}

func decisionFromC(d *C.shardlimit_decision, policy string) Decision {
	var out Decision
	out.fromC(d, policy)
	return out
}

// fromC sets *out to the decision d (of a check of policy), in place.
func (out *Decision) fromC(d *C.shardlimit_decision, policy string) {
	us := func(v C.uint64_t) time.Duration { return time.Duration(v) * time.Microsecond }
	name := unsafe.String((*byte)(unsafe.Pointer(&d.policy[0])), int(d.policy_len))
	if name == policy {
		name = policy // the usual case: no allocation
	} else {
		name = string([]byte(name))
	}
	shard, layer := -1, -1
	if d.has_shard {
		shard = int(d.shard)
	}
	if d.has_layer {
		layer = int(d.layer)
	}
	*out = Decision{
		Allowed:       bool(d.allowed),
		Limit:         uint64(d.limit),
		Remaining:     uint64(d.remaining),
		ResetAfter:    us(d.reset_after_us),
		RetryAfter:    us(d.retry_after_us),
		HasRetryAfter: bool(d.has_retry_after),
		ShadowDenied:  bool(d.shadow_denied),
		Delay:         us(d.delay_us),
		Window:        us(d.window_us),
		Policy:        name,
		Source:        Source(d.source),
		Shard:         shard,
		Layer:         layer,
		LimitIndex:    limitIndex(d),
		Quotas:        quotasOf(d),
		raw:           *d,
	}
}

// Header is one HTTP response header.
type Header struct{ Name, Value string }

// Headers renders the standard rate-limit headers (X-RateLimit-*, RateLimit,
// RateLimit-Policy, and Retry-After when denied) in a stable order.
//
// X-RateLimit-Reset is the Unix time (seconds, rounded up) at which the budget is full
// again, rendered now; the IETF RateLimit field's t keeps delta seconds. The same values
// in every language and every middleware.
func (d *Decision) Headers() ([]Header, error) {
	var h *C.shardlimit_headers
	var e *C.shardlimit_error
	if rc := C.shardlimit_decision_headers(&d.raw, &h, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	defer C.shardlimit_headers_free(h)
	n := int(C.shardlimit_headers_len(h))
	out := make([]Header, 0, n)
	for i := 0; i < n; i++ {
		var name, value C.shardlimit_str
		if rc := C.shardlimit_headers_get(h, C.size_t(i), &name, &value, &e); rc != C.SHARDLIMIT_OK {
			return nil, takeError(rc, e)
		}
		out = append(out, Header{goStr(name), goStr(value)})
	}
	return out, nil
}

// Body renders the JSON body of a 429 response.
func (d *Decision) Body() ([]byte, error) {
	var s C.shardlimit_string
	var e *C.shardlimit_error
	if rc := C.shardlimit_decision_body(&d.raw, &s, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	defer C.shardlimit_string_free(&s)
	return C.GoBytes(unsafe.Pointer(s.ptr), C.int(s.len)), nil
}

// Limiter is a handle on the shardlimit core: a config, Redis connections (or the
// in-memory engine) and the runtime driving them. Safe for concurrent use; call Close
// when done.
type Limiter struct {
	h atomic.Pointer[handle] // nil once closed
	// afterOpen, set by tests only, runs between a call's load of the handle and its use:
	// where a Close on another goroutine can land.
	afterOpen func()
	// afterStart, set by tests only, runs once a call has started and before its
	// goroutine parks: the call is then in flight.
	afterStart func()
	// afterAbandoned, set by tests only, runs once the lease of an Acquire whose caller
	// had gone is given back (or there was none).
	afterAbandoned func()
	// host is the host transport of Check (WithTransport(TransportHost); host.go), or nil
	host atomic.Pointer[hostTransport]
	// calls are the calls in flight, which Close lets finish
	calls callsInFlight
}

// callsInFlight counts a limiter's calls in flight; wait returns once there are none.
type callsInFlight struct {
	n       atomic.Int64
	closing atomic.Bool
	idle    chan struct{} // a wake-up of wait (room for one)
}

func (f *callsInFlight) add() { f.n.Add(1) }

func (f *callsInFlight) done() {
	if f.n.Add(-1) == 0 && f.closing.Load() {
		select {
		case f.idle <- struct{}{}:
		default:
		}
	}
}

// wait, called once (by Close), returns when no call is in flight.
func (f *callsInFlight) wait() {
	f.idle = make(chan struct{}, 1)
	f.closing.Store(true)
	for f.n.Load() != 0 {
		<-f.idle
	}
}

// handle boxes the C pointer (atomic.Pointer cannot hold a pointer to an incomplete type).
type handle struct{ p *C.shardlimit_limiter }

func newLimiter(make func(out **C.shardlimit_limiter, e **C.shardlimit_error) C.shardlimit_result) (*Limiter, error) {
	var h *C.shardlimit_limiter
	var e *C.shardlimit_error
	if rc := make(&h, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	l := &Limiter{}
	l.h.Store(&handle{h})
	openLimiters.Add(1)
	return l, nil
}

// NewFromJSON creates a limiter from a JSON config (the format of shard-config.json).
// It does not connect; connections are made on first use.
func NewFromJSON(config string, opts ...Option) (*Limiter, error) {
	clock, keep, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(keep)
	return hostTo(opts)(logTo(opts)(newLimiter(func(out **C.shardlimit_limiter, e **C.shardlimit_error) C.shardlimit_result {
		p, n := cStr(config)
		return C.shardlimit_limiter_new_json(p, n, clock, out, e)
	})))
}

// NewFromConfigFile creates a limiter from a JSON config file (the name of
// spec/names.json: from_config_file in every language's idiom).
func NewFromConfigFile(path string, opts ...Option) (*Limiter, error) {
	clock, keep, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(keep)
	return hostTo(opts)(logTo(opts)(newLimiter(func(out **C.shardlimit_limiter, e **C.shardlimit_error) C.shardlimit_result {
		p, n := cStr(path)
		return C.shardlimit_limiter_new_file(p, n, clock, out, e)
	})))
}

// NewFromFile is the same as NewFromConfigFile (its earlier name, kept for existing code).
func NewFromFile(path string, opts ...Option) (*Limiter, error) {
	return NewFromConfigFile(path, opts...)
}

// NewFromEnv creates a limiter from $SHARDLIMIT_CONFIG (a path or inline JSON); the
// in-memory engine with no policies when it is unset.
func NewFromEnv(opts ...Option) (*Limiter, error) {
	clock, keep, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(keep)
	return hostTo(opts)(logTo(opts)(newLimiter(func(out **C.shardlimit_limiter, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_limiter_new_env(clock, out, e)
	})))
}

// Check checks cost units (>= 1) of the named policy for key. A denied check is not an
// error: it returns a Decision with Allowed false. It waits for Redis without holding an
// OS thread, and returns ctx.Err() as soon as ctx is done (a check already sent may still
// have been counted); the config's deadline (timeout_ms) bounds it too.
func (l *Limiter) Check(ctx context.Context, key, policy string, cost uint64) (Decision, error) {
	h, err := l.open(ctx)
	if err != nil {
		return Decision{}, err
	}
	if t := l.host.Load(); t != nil {
		l.calls.add()
		d, err, ok := t.check(ctx, key, policy, cost, l.afterStart)
		l.calls.done()
		if ok {
			return d, err
		}
	}
	kp, kn := cStr(key)
	pp, pn := cStr(policy)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_check_named_start(h.p, kp, kn, pp, pn, C.uint64_t(cost), cb, u, out, e)
	})
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(p, policy)
}

// AllowAtMost takes as many of n units (>= 1) of the named policy for key as are free
// now, at most n, as redis_rate's AllowAtMost does: it returns how many it took (0 when
// none: d.Allowed is false) and the decision of that take. One Check of n when they fit;
// otherwise a second Check of the units the denial said were free (d.Remaining). Under
// contention that second Check may find them taken and take nothing: it never takes more
// than the limit allows.
func (l *Limiter) AllowAtMost(ctx context.Context, key, policy string, n uint64) (uint64, Decision, error) {
	if n == 0 {
		return 0, Decision{}, &Error{Code: CodeInvalidArgument, Message: "invalid argument `n`: must be at least 1"}
	}
	d, err := l.Check(ctx, key, policy, n)
	if err != nil || d.Allowed {
		if err != nil {
			return 0, d, err
		}
		return n, d, nil
	}
	free := d.Remaining
	if free == 0 || free >= n || d.Source != SourceRedis && d.Source != SourceMemory {
		// nothing free, or a fallback's or block's denial: nothing to take
		return 0, d, nil
	}
	d2, err := l.Check(ctx, key, policy, free)
	if err != nil {
		return 0, d, err
	}
	if !d2.Allowed {
		return 0, d2, nil
	}
	return free, d2, nil
}

// open is the limiter's live handle for a call with ctx: ctx's error when it is done
// already, ErrClosed after Close.
func (l *Limiter) open(ctx context.Context) (*handle, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := l.h.Load()
	if h == nil {
		return nil, ErrClosed
	}
	if l.afterOpen != nil {
		l.afterOpen()
	}
	return h, nil
}

// withPolicy looks up the named policy in the limiter's config and runs f with it; the
// policy object is freed afterwards.
func (l *Limiter) withPolicy(ctx context.Context, policy string, f func(h *handle, p *C.shardlimit_policy) error) error {
	h, err := l.open(ctx)
	if err != nil {
		return err
	}
	var p *C.shardlimit_policy
	var e *C.shardlimit_error
	pp, pn := cStr(policy)
	if rc := C.shardlimit_limiter_policy(h.p, pp, pn, &p, &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	defer C.shardlimit_policy_free(p)
	return f(h, p)
}

// Peek returns key's state under the named policy without consuming anything: Allowed
// says whether a check of one unit would pass now, Remaining how many units are free.
func (l *Limiter) Peek(ctx context.Context, key, policy string) (Decision, error) {
	var d Decision
	err := l.withPolicy(ctx, policy, func(h *handle, pol *C.shardlimit_policy) error {
		kp, kn := cStr(key)
		p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
			return C.shardlimit_peek_start(h.p, kp, kn, pol, cb, u, out, e)
		})
		if err != nil {
			return err
		}
		d, err = decisionOf(p, policy)
		return err
	})
	return d, err
}

// Reset forgets key's state under the named policy: its full budget is back.
func (l *Limiter) Reset(ctx context.Context, key, policy string) error {
	return l.withPolicy(ctx, policy, func(h *handle, pol *C.shardlimit_policy) error {
		kp, kn := cStr(key)
		p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
			return C.shardlimit_reset_start(h.p, kp, kn, pol, cb, u, out, e)
		})
		if err != nil {
			return err
		}
		return resultOf(p)
	})
}

// ResetPolicy is Reset with a Policy object: an ad-hoc policy (NewPolicy,
// NewPolicyFromRate), or one from Policy or PlanPolicy. key's state under it is
// forgotten: its full budget is back.
func (l *Limiter) ResetPolicy(ctx context.Context, key string, policy *Policy) error {
	h, err := l.open(ctx)
	if err != nil {
		return err
	}
	ph, err := policy.handle()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(policy)
	kp, kn := cStr(key)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_reset_start(h.p, kp, kn, ph, cb, u, out, e)
	})
	if err != nil {
		return err
	}
	return resultOf(p)
}

// Lease is units of a concurrency policy held by one caller, from Acquire. Give it back
// with Release (typically deferred); one never released frees itself after the policy's
// lease TTL. Safe for concurrent use.
//
// An Acquire that a fallback allowed (Redis unreachable, on_error "open" or "local")
// holds nothing in Redis: its Lease is a no-op one (Held reports false, Release does
// nothing), so that "a nil lease means busy" stays true during an outage.
type Lease struct {
	l *Limiter
	p atomic.Pointer[leaseHandle] // nil once released, and always for a no-op lease
}

// Held reports whether the lease holds units in Redis (until released): false for the
// no-op lease of an Acquire a fallback allowed, and after Release.
func (le *Lease) Held() bool { return le != nil && le.p.Load() != nil }

// leaseHandle boxes the C lease (atomic.Pointer cannot hold an incomplete C type).
type leaseHandle struct{ p *C.shardlimit_lease }

// Acquire takes units (>= 1) of the named concurrency policy for key. When allowed
// (d.Allowed), the returned Lease is non-nil: it holds the units until Release, or is a
// no-op lease when a fallback allowed the call (d.Source == SourceFallback: nothing is
// held in Redis). When denied, the Lease is nil and nothing was taken. So
// `if lease == nil { busy }` and `if !d.Allowed { busy }` say the same.
func (l *Limiter) Acquire(ctx context.Context, key, policy string, units uint64) (Decision, *Lease, error) {
	var d C.shardlimit_decision
	var cl *C.shardlimit_lease
	err := l.withPolicy(ctx, policy, func(h *handle, pol *C.shardlimit_policy) error {
		kp, kn := cStr(key)
		// a caller gone before Redis answered (ctx done) gets ctx.Err(); the lease Redis
		// may still grant is released when the call completes, not left held until its TTL
		p, err := l.awaitOrAbandon(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
			return C.shardlimit_acquire_start(h.p, kp, kn, pol, C.uint64_t(units), cb, u, out, e)
		}, l.releaseAbandoned)
		if err != nil {
			return err
		}
		defer C.shardlimit_pending_free(p)
		var e *C.shardlimit_error
		if rc := C.shardlimit_pending_acquired(p, &d, &cl, &e); rc != C.SHARDLIMIT_OK {
			return takeError(rc, e)
		}
		return nil
	})
	if err != nil {
		return Decision{}, nil, err
	}
	dec := decisionFromC(&d, policy)
	if cl == nil {
		if dec.Allowed {
			// a fallback allowed it: nothing is held, Release has nothing to give back
			return dec, &Lease{l: l}, nil
		}
		return dec, nil, nil
	}
	lease := &Lease{l: l}
	lease.p.Store(&leaseHandle{cl})
	// a lease dropped without Release: free the C object (the units expire on their own)
	runtime.SetFinalizer(lease, func(le *Lease) {
		if lh := le.p.Swap(nil); lh != nil {
			C.shardlimit_lease_free(lh.p)
		}
	})
	return dec, lease, nil
}

// releaseAbandoned takes the outcome of an Acquire whose caller has gone (its ctx ended
// first) and releases the lease it holds, if any.
func (l *Limiter) releaseAbandoned(p *C.shardlimit_pending) {
	var d C.shardlimit_decision
	var cl *C.shardlimit_lease
	var e *C.shardlimit_error
	rc := C.shardlimit_pending_acquired(p, &d, &cl, &e)
	C.shardlimit_pending_free(p)
	if rc != C.SHARDLIMIT_OK {
		_ = takeError(rc, e) // denied, failed or cancelled: nothing is held
	} else if cl != nil {
		lease := &Lease{l: l}
		lease.p.Store(&leaseHandle{cl})
		if _, err := lease.Release(context.Background()); err != nil {
			// not given back (the limiter closed, Redis failed): it expires after its TTL
			if lh := lease.p.Swap(nil); lh != nil {
				C.shardlimit_lease_free(lh.p)
			}
		}
	}
	if l.afterAbandoned != nil {
		l.afterAbandoned()
	}
}

// Release gives the lease's units back. It reports whether the lease was still held:
// false when it had already been released or had expired, and for the no-op lease of a
// fallback. Releasing twice is not an error (the second call returns false). After the
// limiter is closed, Release returns ErrClosed and the units expire after the lease TTL.
//
// ctx passes its values only: Release is not cut short when ctx is cancelled or past its
// deadline, so `defer lease.Release(r.Context())` gives the units back also when the
// client has gone away. The config's deadline (timeout_ms) bounds it instead.
func (le *Lease) Release(ctx context.Context) (bool, error) {
	if le == nil {
		return false, &Error{Code: CodeInvalidArgument, Message: "invalid argument `lease`: nil (a denied Acquire returns no lease)"}
	}
	if le.p.Load() == nil {
		return false, nil // released already, or a fallback's no-op lease
	}
	ctx = context.WithoutCancel(ctx)
	h, err := le.l.open(ctx)
	if err != nil {
		return false, err
	}
	lh := le.p.Swap(nil)
	if lh == nil {
		return false, nil
	}
	p, err := le.l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_release_start(h.p, lh.p, cb, u, out, e)
	})
	var released bool
	if err == nil {
		released, err = boolOf(p)
	}
	var se *Error
	if err != nil && (ctx.Err() != nil || (errors.As(err, &se) && se.IsBackend())) {
		// Redis did not answer (or ctx ended first): keep the lease, so that Release can
		// be tried again
		le.p.Store(lh)
		return false, err
	}
	C.shardlimit_lease_free(lh.p)
	return released, err
}

// Layer is one layer of CheckAll: Cost units of the named Policy for Key.
type Layer struct {
	Key    string
	Policy string
	Cost   uint64
}

// CheckAll is a layered check (IP, API key, tenant, global... at most 64 layers):
// allowed only if every layer allows; when any layer denies, no layer consumes.
// Decision.Layer says which layer the decision describes.
func (l *Limiter) CheckAll(ctx context.Context, layers []Layer) (Decision, error) {
	h, err := l.open(ctx)
	if err != nil {
		return Decision{}, err
	}
	// The layer array holds pointers to Go strings, so it lives in C memory (cgo forbids
	// passing Go memory that contains Go pointers).
	n := len(layers)
	var cl *C.shardlimit_layer
	if n > 0 {
		cl = (*C.shardlimit_layer)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.shardlimit_layer{}))))
		defer C.free(unsafe.Pointer(cl))
		// the strings themselves are copied too: C memory must not point into Go memory
		// that the GC could move or free while C reads it
		arr := unsafe.Slice(cl, n)
		for i, x := range layers {
			arr[i].key = C.CString(x.Key)
			arr[i].key_len = C.size_t(len(x.Key))
			arr[i].policy_name = C.CString(x.Policy)
			arr[i].policy_name_len = C.size_t(len(x.Policy))
			arr[i].cost = C.uint64_t(x.Cost)
		}
		defer func() {
			for i := range arr {
				C.free(unsafe.Pointer(arr[i].key))
				C.free(unsafe.Pointer(arr[i].policy_name))
			}
		}()
	}
	// the layers are read (and copied) by the start call itself
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_check_all_start(h.p, cl, C.size_t(n), cb, u, out, e)
	})
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(p, "")
}

// Block puts key on the block list for ttl (0: until Unblock), with a reason. Every
// limiter sharing the shards, in any language, then denies it with SourceBlock.
func (l *Limiter) Block(ctx context.Context, key string, ttl time.Duration, reason string) error {
	h, err := l.open(ctx)
	if err != nil {
		return err
	}
	if ttl < 0 {
		return &Error{Code: CodeInvalidArgument, Message: "invalid argument `ttl`: must not be negative"}
	}
	ms := uint64((ttl + time.Millisecond - 1) / time.Millisecond)
	kp, kn := cStr(key)
	rp, rn := cStr(reason)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_block_start(h.p, kp, kn, C.uint64_t(ms), rp, rn, cb, u, out, e)
	})
	if err != nil {
		return err
	}
	return resultOf(p)
}

// Unblock removes key from the block list and reports whether it was blocked.
func (l *Limiter) Unblock(ctx context.Context, key string) (bool, error) {
	h, err := l.open(ctx)
	if err != nil {
		return false, err
	}
	kp, kn := cStr(key)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_unblock_start(h.p, kp, kn, cb, u, out, e)
	})
	if err != nil {
		return false, err
	}
	return boolOf(p)
}

// Connect connects to every shard and loads the scripts within timeout (its own budget,
// not a call's deadline), so that the first calls after start-up do not spend their
// deadline on a TCP connect and fall back. Call it once at start-up; it returns the first
// shard's error when one does not answer in time (ctx.Err() when ctx ends first). Nothing
// to do in memory.
func (l *Limiter) Connect(ctx context.Context, timeout time.Duration) error {
	h, err := l.open(ctx)
	if err != nil {
		return err
	}
	if timeout < time.Millisecond {
		return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("invalid argument `timeout`: %v is under 1 ms", timeout)}
	}
	ms := C.uint64_t(timeout / time.Millisecond)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_connect_start(h.p, ms, cb, u, out, e)
	})
	if err != nil {
		return err
	}
	return resultOf(p)
}

// BlockInfo is a key's block-list entry.
type BlockInfo struct {
	Reason string
	// Remaining is the time left; 0 for a permanent block.
	Remaining time.Duration
	Permanent bool
}

// Blocked returns key's block-list entry, or nil when it is not blocked.
func (l *Limiter) Blocked(ctx context.Context, key string) (*BlockInfo, error) {
	h, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	kp, kn := cStr(key)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_blocked_start(h.p, kp, kn, cb, u, out, e)
	})
	if err != nil {
		return nil, err
	}
	defer C.shardlimit_pending_free(p)
	var info C.shardlimit_block_info
	var e *C.shardlimit_error
	if rc := C.shardlimit_pending_block_info(p, &info, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	defer C.shardlimit_string_free(&info.reason)
	if !info.blocked {
		return nil, nil
	}
	return &BlockInfo{
		Reason:    C.GoStringN(info.reason.ptr, C.int(info.reason.len)),
		Remaining: time.Duration(info.remaining_us) * time.Microsecond,
		Permanent: bool(info.permanent),
	}, nil
}

// ClientIP is the client's address for rate limiting: peer (a socket address, with or
// without port) unless it is one of the trusted proxies (CIDRs); then the
// X-Forwarded-For entries from the right, skipping trusted proxies. xff is the raw
// header ("" when absent). The rule lives in the core, shared by every binding.
func ClientIP(peer, xff string, trusted []string) (string, error) {
	return clientIP(peer, xff, trusted, -1)
}

// DefaultIPv6Prefix is the network size that ClientIPKey and the middleware key IPv6
// clients by, as every binding does.
const DefaultIPv6Prefix = 64

// ClientIPKey is the rate-limit key of the client ClientIP finds: an IPv4 address (or an
// IPv4-mapped IPv6 one) as the IPv4 address, an IPv6 address as its network of
// ipv6Prefix bits ("2001:db8:1:2::/64"; 1 to 128), so that one client cannot take a
// fresh budget per address of its network. The same key in every language.
func ClientIPKey(peer, xff string, trusted []string, ipv6Prefix int) (string, error) {
	if ipv6Prefix < 0 || ipv6Prefix > 255 {
		// (what fits a uint8 goes to the core, which checks the range)
		return "", &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("invalid argument `ipv6_prefix`: must be between 1 and 128, got %d", ipv6Prefix)}
	}
	return clientIP(peer, xff, trusted, ipv6Prefix)
}

// clientIP calls shardlimit_client_ip, or shardlimit_client_ip_key with a prefix >= 0.
func clientIP(peer, xff string, trusted []string, ipv6Prefix int) (string, error) {
	var cxff *C.char
	xp, xn := cStr(xff)
	if xff != "" {
		cxff = xp
	}
	var ct *C.shardlimit_str
	if len(trusted) > 0 {
		ct = (*C.shardlimit_str)(C.calloc(C.size_t(len(trusted)), C.size_t(unsafe.Sizeof(C.shardlimit_str{}))))
		defer C.free(unsafe.Pointer(ct))
		arr := unsafe.Slice(ct, len(trusted))
		for i, t := range trusted {
			arr[i].ptr = C.CString(t)
			arr[i].len = C.size_t(len(t))
		}
		defer func() {
			for i := range arr {
				C.free(unsafe.Pointer(arr[i].ptr))
			}
		}()
	}
	var out C.shardlimit_string
	var e *C.shardlimit_error
	pp, pn := cStr(peer)
	var rc C.shardlimit_result
	if ipv6Prefix < 0 {
		rc = C.shardlimit_client_ip(pp, pn, cxff, xn, ct, C.size_t(len(trusted)), &out, &e)
	} else {
		rc = C.shardlimit_client_ip_key(pp, pn, cxff, xn, ct, C.size_t(len(trusted)), C.uint8_t(ipv6Prefix), &out, &e)
	}
	if rc != C.SHARDLIMIT_OK {
		return "", takeError(rc, e)
	}
	defer C.shardlimit_string_free(&out)
	return C.GoStringN(out.ptr, C.int(out.len)), nil
}

// Close frees the limiter. Safe while other goroutines use it: later calls return
// ErrClosed, calls already in flight finish normally with this limiter (Close waits for
// them: Redis answers, or their deadline, timeout_ms, passes and their policy's on_error
// decides), and a Limiter created afterwards never answers for this one (the C handles
// are never reused). Once every limiter is closed, no goroutine of this package is left.
// Closing twice is a no-op.
func (l *Limiter) Close() error {
	h := l.h.Swap(nil)
	if h != nil {
		l.calls.wait()
	}
	// after the handle: a check the host transport turned away with ErrClosed is
	// followed by ErrClosed, never by a decision of the default path
	if t := l.host.Swap(nil); t != nil {
		t.close()
	}
	if h != nil {
		C.shardlimit_limiter_free(h.p)
		limiterClosed()
	}
	return nil
}

// Version is the version of the linked libshardlimit.
func Version() string { return goStr(C.shardlimit_version()) }

// HeaderVersion is the version of the header this package was compiled against.
const HeaderVersion = C.SHARDLIMIT_VERSION
