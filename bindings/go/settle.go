package shardlimit

/*
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"errors"
	"sync/atomic"
	"unsafe"
)

// Charge consumes cost units (>= 1) of the named policy for key without ever denying:
// the key may go into debt (capped at one limit), and later checks are denied until it
// is repaid, with an exact RetryAfter. The Decision is always allowed; Remaining (0 in
// debt) and ResetAfter describe the key after the charge. A concurrency policy is an
// invalid argument (use Acquire and Release); a backend failure is an error (nothing was
// charged).
func (l *Limiter) Charge(ctx context.Context, key, policy string, cost uint64) (Decision, error) {
	return l.settleCall(ctx, key, policy, func(h *handle, pol *C.shardlimit_policy, kp *C.char, kn C.size_t, cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_charge_start(h.p, kp, kn, pol, C.uint64_t(cost), cb, u, out, e)
	})
}

// Refund gives cost units (>= 1) of the named policy back to key, never above its limit
// (a full budget stays full). The Decision is as Charge's.
func (l *Limiter) Refund(ctx context.Context, key, policy string, cost uint64) (Decision, error) {
	return l.settleCall(ctx, key, policy, func(h *handle, pol *C.shardlimit_policy, kp *C.char, kn C.size_t, cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_refund_start(h.p, kp, kn, pol, C.uint64_t(cost), cb, u, out, e)
	})
}

type settleStarter func(h *handle, pol *C.shardlimit_policy, kp *C.char, kn C.size_t, cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result

func (l *Limiter) settleCall(ctx context.Context, key, policy string, start settleStarter) (Decision, error) {
	var d Decision
	err := l.withPolicy(ctx, policy, func(h *handle, pol *C.shardlimit_policy) error {
		kp, kn := cStr(key)
		p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
			return start(h, pol, kp, kn, cb, u, out, e)
		})
		if err != nil {
			return err
		}
		d, err = decisionOf(p, policy)
		return err
	})
	return d, err
}

// Reservation is units reserved by Reserve: Settle it once the actual cost is known. It
// carries when the units were recorded, so that the unused part goes back to the window
// that admitted it. Safe for concurrent use; it settles once.
type Reservation struct {
	Key, Policy string
	Units       uint64
	// AtUs is when the units were recorded (µs on the engine's clock).
	AtUs    uint64
	l       *Limiter
	settled atomic.Bool
}

// Reserve is a check of an estimated cost (estimate >= 1 units) that can be settled
// later: when allowed (by Redis or the in-memory engine, not by on_error) the returned
// Reservation is non-nil; when denied it is nil and nothing was taken.
func (l *Limiter) Reserve(ctx context.Context, key, policy string, estimate uint64) (Decision, *Reservation, error) {
	var d C.shardlimit_decision
	var r C.shardlimit_reservation
	err := l.withPolicy(ctx, policy, func(h *handle, pol *C.shardlimit_policy) error {
		kp, kn := cStr(key)
		p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
			return C.shardlimit_reserve_start(h.p, kp, kn, pol, C.uint64_t(estimate), cb, u, out, e)
		})
		if err != nil {
			return err
		}
		defer C.shardlimit_pending_free(p)
		var e *C.shardlimit_error
		if rc := C.shardlimit_pending_reserved(p, &d, &r, &e); rc != C.SHARDLIMIT_OK {
			return takeError(rc, e)
		}
		return nil
	})
	if err != nil {
		return Decision{}, nil, err
	}
	dec := decisionFromC(&d, policy)
	if !bool(r.reserved) {
		return dec, nil, nil
	}
	return dec, &Reservation{Key: key, Policy: policy, Units: uint64(r.units), AtUs: uint64(r.at_us), l: l}, nil
}

// Settle settles the reservation at its actual cost (0 gives it all back): the unused
// part goes back to the window that admitted it, the excess is charged. A second Settle
// is an invalid argument. The Decision is as Charge's.
func (r *Reservation) Settle(ctx context.Context, actual uint64) (Decision, error) {
	if r == nil || r.l == nil {
		return Decision{}, &Error{Code: CodeInvalidArgument, Message: "invalid argument `reservation`: nil (a denied Reserve returns none)"}
	}
	if !r.settled.CompareAndSwap(false, true) {
		return Decision{}, &Error{Code: CodeInvalidArgument, Message: "invalid argument `reservation`: settled already"}
	}
	cr := C.shardlimit_reservation{reserved: true, units: C.uint64_t(r.Units), at_us: C.uint64_t(r.AtUs)}
	d, err := r.l.settleCall(ctx, r.Key, r.Policy, func(h *handle, pol *C.shardlimit_policy, kp *C.char, kn C.size_t, cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_settle_start(h.p, kp, kn, pol, &cr, C.uint64_t(actual), cb, u, out, e)
	})
	var se *Error
	if err != nil && ctx.Err() == nil && !(errors.As(err, &se) && se.IsBackend()) {
		// refused before anything was sent: it may be tried again (after a backend failure
		// or a cancel it may have been applied, and settling twice would give back twice)
		r.settled.Store(false)
	}
	return d, err
}
