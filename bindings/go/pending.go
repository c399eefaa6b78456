package shardlimit

/*
#include <stdint.h>
#include "shardlimit.h"

extern void shardlimitGoComplete(void *user, shardlimit_pending *pending);

static shardlimit_callback sl_go_callback(void) { return shardlimitGoComplete; }

// A cgo.Handle as the callback's user pointer: an integer the library never dereferences.
static void *sl_user(uintptr_t handle) { return (void *)handle; }
*/
import "C"

import (
	"context"
	"runtime/cgo"
	"unsafe"
)

var goCallback = C.sl_go_callback()

// starter starts one C call with the Go callback and a user pointer.
type starter func(cb C.shardlimit_callback, user unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result

// await starts a call and parks the goroutine (no OS thread: a channel receive) until the
// call completes or ctx is done. On completion it returns the pending, which the caller
// reads and frees. When ctx ends first the call is cancelled and ctx.Err() returned,
// unless it completed in the meantime: then its result stands.
func (l *Limiter) await(ctx context.Context, start starter) (*C.shardlimit_pending, error) {
	done := make(chan struct{}, 1)
	h := cgo.NewHandle(done)
	var p *C.shardlimit_pending
	var e *C.shardlimit_error
	if rc := start(goCallback, C.sl_user(C.uintptr_t(h)), &p, &e); rc != C.SHARDLIMIT_OK {
		// no pending: the callback will never run
		h.Delete()
		return nil, takeError(rc, e)
	}
	if l.afterStart != nil {
		l.afterStart()
	}
	select {
	case <-done:
		return p, nil
	case <-ctx.Done():
		if C.shardlimit_pending_cancel(p) {
			// cancelled: the callback ran inside cancel (and deleted the handle)
			C.shardlimit_pending_free(p)
			return nil, ctx.Err()
		}
		<-done // completed first: the callback has run or is about to
		return p, nil
	}
}

// decisionOf reads a completed check's decision and frees the pending.
func decisionOf(p *C.shardlimit_pending, policy string) (Decision, error) {
	defer C.shardlimit_pending_free(p)
	var d C.shardlimit_decision
	var e *C.shardlimit_error
	if rc := C.shardlimit_pending_decision(p, &d, &e); rc != C.SHARDLIMIT_OK {
		return Decision{}, takeError(rc, e)
	}
	return decisionFromC(&d, policy), nil
}

// boolOf reads a completed release's or unblock's answer and frees the pending.
func boolOf(p *C.shardlimit_pending) (bool, error) {
	defer C.shardlimit_pending_free(p)
	var b C.bool
	var e *C.shardlimit_error
	if rc := C.shardlimit_pending_bool(p, &b, &e); rc != C.SHARDLIMIT_OK {
		return false, takeError(rc, e)
	}
	return bool(b), nil
}

// resultOf reads a completed call's result code and frees the pending.
func resultOf(p *C.shardlimit_pending) error {
	defer C.shardlimit_pending_free(p)
	var e *C.shardlimit_error
	if rc := C.shardlimit_pending_result(p, &e); rc != C.SHARDLIMIT_OK {
		return takeError(rc, e)
	}
	return nil
}
