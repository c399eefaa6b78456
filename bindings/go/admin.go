package shardlimit

/*
#include <stdlib.h>
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"time"
	"unsafe"
)

// IsRedis reports whether decisions run on Redis (else in memory).
func (l *Limiter) IsRedis() bool {
	h := l.h.Load()
	return h != nil && bool(C.shardlimit_is_redis(h.p))
}

// MemoryKeys is how many keys the in-memory engine holds; ok is false on Redis.
func (l *Limiter) MemoryKeys() (n int, ok bool, err error) {
	h, err := l.open(context.Background())
	if err != nil {
		return 0, false, err
	}
	var has C.bool
	var count C.size_t
	var e *C.shardlimit_error
	if rc := C.shardlimit_memory_keys(h.p, &has, &count, &e); rc != C.SHARDLIMIT_OK {
		return 0, false, takeError(rc, e)
	}
	return int(count), bool(has), nil
}

// Route is the shard key routes to (index and name): the public routing contract, the
// same in every language. An error on the in-memory engine.
func (l *Limiter) Route(key string) (int, string, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return 0, "", err
	}
	var idx C.uint32_t
	var name C.shardlimit_string
	var e *C.shardlimit_error
	kp, kn := cStr(key)
	if rc := C.shardlimit_route(h.p, kp, kn, &idx, &name, &e); rc != C.SHARDLIMIT_OK {
		return 0, "", takeError(rc, e)
	}
	defer C.shardlimit_string_free(&name)
	return int(idx), C.GoStringN(name.ptr, C.int(name.len)), nil
}

// Reload applies a new JSON config to the running limiter: calls in flight finish on the
// old one; connections and counters stay where they still apply. A bad config is refused
// (ErrConfig naming the field) and the old one stays in force.
func (l *Limiter) Reload(config string) error {
	h, err := l.open(context.Background())
	if err != nil {
		return err
	}
	var e *C.shardlimit_error
	p, n := cStr(config)
	if rc := C.shardlimit_reload(h.p, p, n, &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}

// ReloadFromFile is Reload from a config file.
func (l *Limiter) ReloadFromFile(path string) error {
	h, err := l.open(context.Background())
	if err != nil {
		return err
	}
	var e *C.shardlimit_error
	p, n := cStr(path)
	if rc := C.shardlimit_reload_from_file(h.p, p, n, &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}

// SetScale scales the limits of the named policies (every policy when none is named) by
// factor, 0 < factor <= 1 (adaptive limits). Decisions and headers report the
// effective limit.
func (l *Limiter) SetScale(factor float64, policies ...string) error {
	h, err := l.open(context.Background())
	if err != nil {
		return err
	}
	var names *C.shardlimit_str
	if len(policies) > 0 {
		// C memory: the array points to strings (cgo forbids Go pointers in Go memory)
		names = (*C.shardlimit_str)(C.calloc(C.size_t(len(policies)), C.size_t(unsafe.Sizeof(C.shardlimit_str{}))))
		defer C.free(unsafe.Pointer(names))
		arr := unsafe.Slice(names, len(policies))
		for i, p := range policies {
			arr[i].ptr = C.CString(p)
			arr[i].len = C.size_t(len(p))
		}
		defer func() {
			for i := range arr {
				C.free(unsafe.Pointer(arr[i].ptr))
			}
		}()
	}
	var e *C.shardlimit_error
	if rc := C.shardlimit_set_scale(h.p, C.double(factor), names, C.size_t(len(policies)), &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}

// Scale is the global scale factor in force (1 unless SetScale changed it).
func (l *Limiter) Scale() float64 {
	h := l.h.Load()
	if h == nil {
		return 0
	}
	return float64(C.shardlimit_scale(h.p))
}

// SetLatencyScale installs the core's latency hook that ObserveHealth feeds: full limits
// while the signal (seconds) is at or under target, target/signal above it, never below
// minFactor. (A hook of one's own: compute the factor and call SetScale.)
func (l *Limiter) SetLatencyScale(target time.Duration, minFactor float64) error {
	h, err := l.open(context.Background())
	if err != nil {
		return err
	}
	if target < 0 {
		return &Error{Code: CodeInvalidArgument, Message: "invalid argument `target`: must not be negative"}
	}
	var e *C.shardlimit_error
	if rc := C.shardlimit_set_latency_scale(h.p, C.uint64_t(target/time.Microsecond), C.double(minFactor), &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}

// ObserveHealth feeds a health signal (the p99 latency of the protected dependency, in
// seconds) through the scale hook and returns the factor now in force.
func (l *Limiter) ObserveHealth(signal float64) (float64, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return 0, err
	}
	var f C.double
	var e *C.shardlimit_error
	if rc := C.shardlimit_observe_health(h.p, C.double(signal), &f, &e); rc != C.SHARDLIMIT_OK {
		return 0, takeError(rc, e)
	}
	return float64(f), nil
}

// Metrics is the limiter's counters in the Prometheus text format, for a /metrics
// endpoint: metrics() is this text in every language (spec/names.json).
func (l *Limiter) Metrics() (string, error) {
	return l.MetricsPrometheus()
}

// MetricsSnapshot is the limiter's counters as JSON (per policy: allowed, denied,
// fallback, blocked, local_admitted, redis_errors; the Redis latency histogram; events
// dropped).
func (l *Limiter) MetricsSnapshot() ([]byte, error) {
	return l.text(func(h *C.shardlimit_limiter, out *C.shardlimit_string, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_metrics(h, out, e)
	})
}

// MetricsPrometheus is the same as Metrics (its earlier name, kept for existing code).
func (l *Limiter) MetricsPrometheus() (string, error) {
	b, err := l.text(func(h *C.shardlimit_limiter, out *C.shardlimit_string, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_metrics_prometheus(h, out, e)
	})
	return string(b), err
}

func (l *Limiter) text(f func(*C.shardlimit_limiter, *C.shardlimit_string, **C.shardlimit_error) C.shardlimit_result) ([]byte, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return nil, err
	}
	var s C.shardlimit_string
	var e *C.shardlimit_error
	if rc := f(h.p, &s, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	defer C.shardlimit_string_free(&s)
	return C.GoBytes(unsafe.Pointer(s.ptr), C.int(s.len)), nil
}
