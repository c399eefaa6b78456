package shardlimit

/*
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Clock is a manual clock for deterministic tests: a limiter created with WithClock reads
// time from it instead of Redis TIME or the monotonic clock. Safe for concurrent use.
// Close it when done (limiters using it keep their own reference).
type Clock struct {
	p atomic.Pointer[clockHandle] // nil once closed
}

type clockHandle struct{ p *C.shardlimit_clock }

// NewManualClock is a manual clock reading start.
func NewManualClock(start time.Time) (*Clock, error) {
	us := start.UnixMicro()
	if us < 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument `start`: before 1970"}
	}
	var c *C.shardlimit_clock
	var e *C.shardlimit_error
	if rc := C.shardlimit_clock_new(C.uint64_t(us), &c, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	clock := &Clock{}
	clock.p.Store(&clockHandle{c})
	runtime.SetFinalizer(clock, (*Clock).Close)
	return clock, nil
}

func (c *Clock) handle() (*C.shardlimit_clock, error) {
	if c == nil {
		return nil, nil
	}
	h := c.p.Load()
	if h == nil {
		return nil, &Error{Code: CodeClosed, Message: "this Clock was closed"}
	}
	return h.p, nil
}

// Set moves the clock to t (forwards or backwards).
func (c *Clock) Set(t time.Time) error {
	h, err := c.handle()
	if err != nil || h == nil {
		return orNil(err)
	}
	us := t.UnixMicro()
	if us < 0 {
		return &Error{Code: CodeInvalidArgument, Message: "invalid argument `t`: before 1970"}
	}
	var e *C.shardlimit_error
	if rc := C.shardlimit_clock_set_us(h, C.uint64_t(us), &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}

// Advance moves the clock forward by d (>= 0).
func (c *Clock) Advance(d time.Duration) error {
	h, err := c.handle()
	if err != nil || h == nil {
		return orNil(err)
	}
	if d < 0 {
		return &Error{Code: CodeInvalidArgument, Message: "invalid argument `d`: must not be negative"}
	}
	var e *C.shardlimit_error
	if rc := C.shardlimit_clock_advance_us(h, C.uint64_t(d/time.Microsecond), &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}

// Close frees the clock; limiters created with it keep using it. Closing twice is a no-op.
func (c *Clock) Close() error {
	if h := c.p.Swap(nil); h != nil {
		C.shardlimit_clock_free(h.p)
	}
	return nil
}

func orNil(err error) error {
	if err != nil {
		return err
	}
	return &Error{Code: CodeInvalidArgument, Message: "invalid argument `clock`: nil"}
}

// Option configures a limiter's construction.
type Option func(*options)

type options struct {
	clock *Clock
	log   logOption // logging.go
	// transport: host.go
	transport Transport
	// hostStats, set by tests only, counts what the host transport did
	hostStats    *hostStats
	transportSet bool
}

// WithClock makes the limiter decide on clock (tests) instead of Redis TIME or the
// monotonic clock.
func WithClock(c *Clock) Option { return func(o *options) { o.clock = c } }

func buildOptions(opts []Option) (*C.shardlimit_clock, *Clock, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.clock == nil {
		return nil, nil, nil
	}
	h, err := o.clock.handle()
	return h, o.clock, err
}

// NewMemory creates a limiter on the in-memory engine (no Redis): decisions are local to
// this process. With no config it has no named policies: use ad-hoc policies (NewPolicy).
func NewMemory(opts ...Option) (*Limiter, error) {
	clock, keep, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(keep)
	return logTo(opts)(newLimiter(func(out **C.shardlimit_limiter, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_limiter_new_memory(clock, out, e)
	}))
}

// Algorithm is the algorithm of an ad-hoc Limit.
type Algorithm uint32

// The algorithms, from the C header.
const (
	FixedWindow   Algorithm = C.SHARDLIMIT_ALGORITHM_FIXED_WINDOW
	SlidingWindow Algorithm = C.SHARDLIMIT_ALGORITHM_SLIDING_WINDOW
	SlidingLog    Algorithm = C.SHARDLIMIT_ALGORITHM_SLIDING_LOG
	TokenBucket   Algorithm = C.SHARDLIMIT_ALGORITHM_TOKEN_BUCKET
	LeakyBucket   Algorithm = C.SHARDLIMIT_ALGORITHM_LEAKY_BUCKET
	Concurrency   Algorithm = C.SHARDLIMIT_ALGORITHM_CONCURRENCY
)

// OnErrorMode is what an ad-hoc policy does when its Redis shard fails.
type OnErrorMode uint32

// The modes, from the C header; OnErrorDefault is the core's default (open).
const (
	OnErrorDefault OnErrorMode = C.SHARDLIMIT_ON_ERROR_DEFAULT
	OnErrorOpen    OnErrorMode = C.SHARDLIMIT_ON_ERROR_OPEN
	OnErrorClosed  OnErrorMode = C.SHARDLIMIT_ON_ERROR_CLOSED
	OnErrorLocal   OnErrorMode = C.SHARDLIMIT_ON_ERROR_LOCAL
	OnErrorError   OnErrorMode = C.SHARDLIMIT_ON_ERROR_ERROR
)

// Limit is an ad-hoc limit: an algorithm and its parameters. The core validates them.
type Limit struct {
	Algorithm Algorithm
	// Limit is units per window (windows), capacity (buckets) or max held (concurrency).
	Limit uint64
	// Period is the window, or the lease TTL of a concurrency limit: whole milliseconds
	// (NewPolicy refuses 500µs or 1.5ms rather than truncate them).
	Period time.Duration
	// RatePerSec is the refill (token bucket) or leak (leaky bucket) rate.
	RatePerSec float64
	OnError    OnErrorMode
}

// Policy is a named limit, ad hoc (NewPolicy) or from a limiter's config
// (Limiter.Policy). Safe for concurrent use; Close it when done.
type Policy struct {
	p    atomic.Pointer[policyHandle]
	name string
}

type policyHandle struct{ p *C.shardlimit_policy }

func wrapPolicy(p *C.shardlimit_policy) *Policy {
	pol := &Policy{name: goStr(C.shardlimit_policy_name(p))}
	pol.p.Store(&policyHandle{p})
	runtime.SetFinalizer(pol, (*Policy).Close)
	return pol
}

// NewPolicy is an ad-hoc policy named name (letters, digits, _ - ., at most 128 bytes:
// it appears in Redis keys and headers) enforcing limit, for any limiter.
func NewPolicy(name string, limit Limit) (*Policy, error) {
	if limit.Period < 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument `limit.Period`: must not be negative"}
	}
	if limit.Period%time.Millisecond != 0 {
		// the core counts whole milliseconds: 500µs would silently become 0, 1.5ms 1ms
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("invalid argument `limit.Period`: %v is not a whole number of milliseconds (the smallest period is 1ms)", limit.Period)}
	}
	cl := C.shardlimit_limit{
		algorithm:    C.uint32_t(limit.Algorithm),
		limit:        C.uint64_t(limit.Limit),
		period_ms:    C.uint64_t(limit.Period / time.Millisecond),
		rate_per_sec: C.double(limit.RatePerSec),
		on_error:     C.uint32_t(limit.OnError),
	}
	var p *C.shardlimit_policy
	var e *C.shardlimit_error
	np, nn := cStr(name)
	if rc := C.shardlimit_policy_new(np, nn, &cl, &p, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	return wrapPolicy(p), nil
}

// Name is the policy's name.
func (p *Policy) Name() string { return p.name }

// Close frees the policy. Closing twice is a no-op.
func (p *Policy) Close() error {
	if h := p.p.Swap(nil); h != nil {
		C.shardlimit_policy_free(h.p)
	}
	return nil
}

func (p *Policy) handle() (*C.shardlimit_policy, error) {
	if p == nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument `policy`: nil"}
	}
	h := p.p.Load()
	if h == nil {
		return nil, &Error{Code: CodeClosed, Message: "this Policy was closed"}
	}
	return h.p, nil
}

// Policy is the named policy of the limiter's config (ErrUnknownPolicy when it has none).
func (l *Limiter) Policy(name string) (*Policy, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return nil, err
	}
	var p *C.shardlimit_policy
	var e *C.shardlimit_error
	np, nn := cStr(name)
	if rc := C.shardlimit_limiter_policy(h.p, np, nn, &p, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	return wrapPolicy(p), nil
}

// CheckPolicy is Check with a Policy object: an ad-hoc policy, or one from Policy.
func (l *Limiter) CheckPolicy(ctx context.Context, key string, policy *Policy, cost uint64) (Decision, error) {
	h, err := l.open(ctx)
	if err != nil {
		return Decision{}, err
	}
	ph, err := policy.handle()
	if err != nil {
		return Decision{}, err
	}
	defer runtime.KeepAlive(policy)
	kp, kn := cStr(key)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_check_start(h.p, kp, kn, ph, C.uint64_t(cost), cb, u, out, e)
	})
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(p, policy.name)
}
