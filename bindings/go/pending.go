package shardlimit

/*
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "shardlimit.h"

// The completion queue of started calls. The library's callback runs on its I/O thread; a
// callback into Go from there would need the Go scheduler's P (with GOMAXPROCS=1, the one P
// the goroutines hold), costing a thread switch per call. Instead the callback appends the
// call's tag (a cgo.Handle) here and, when the queue was empty, writes one byte to a pipe
// whose read end the Go runtime's network poller watches: one wake-up per burst of
// completions, read by one goroutine (dispatch) that wakes each waiting goroutine.
// The queue holds at most one entry per call in flight, so it is bounded by them.
static pthread_mutex_t sl_q_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t *sl_q_buf;
static size_t sl_q_len, sl_q_cap;
static int sl_q_wake = -1; // the pipe's write end

static void sl_q_complete(void *user, shardlimit_pending *pending) {
	(void)pending;
	pthread_mutex_lock(&sl_q_mu);
	if (sl_q_len == sl_q_cap) {
		size_t cap = sl_q_cap ? sl_q_cap * 2 : 256;
		uintptr_t *buf = realloc(sl_q_buf, cap * sizeof *buf);
		if (buf == NULL) {
			// out of memory: the waiting goroutine could never be woken; stop, as Go does
			abort();
		}
		sl_q_buf = buf;
		sl_q_cap = cap;
	}
	int was_empty = sl_q_len == 0;
	sl_q_buf[sl_q_len++] = (uintptr_t)user;
	pthread_mutex_unlock(&sl_q_mu);
	if (was_empty) {
		char b = 1;
		// non-blocking: a full pipe already holds a wake-up the reader has not taken
		while (write(sl_q_wake, &b, 1) < 0 && errno == EINTR) {
		}
	}
}

// Moves up to cap tags to out, oldest first; returns how many.
static size_t sl_q_drain(uintptr_t *out, size_t cap) {
	pthread_mutex_lock(&sl_q_mu);
	size_t n = sl_q_len < cap ? sl_q_len : cap;
	memcpy(out, sl_q_buf, n * sizeof *out);
	memmove(sl_q_buf, sl_q_buf + n, (sl_q_len - n) * sizeof *out);
	sl_q_len -= n;
	pthread_mutex_unlock(&sl_q_mu);
	return n;
}

// Makes the pipe (both ends non-blocking, close-on-exec) and returns its read end, or -1.
static int sl_q_open(void) {
	int fds[2];
	if (pipe(fds) != 0) {
		return -1;
	}
	for (int i = 0; i < 2; i++) {
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
		fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
	}
	sl_q_wake = fds[1];
	return fds[0];
}

static shardlimit_callback sl_go_callback(void) { return sl_q_complete; }

// Wakes the reader without a completion: it then sees whether it may stop.
static void sl_q_poke(void) {
	char b = 0;
	while (write(sl_q_wake, &b, 1) < 0 && errno == EINTR) {
	}
}

// A subscription's notify callback: the same queue, with a waker's id as the tag.
static void sl_q_notify(void *user) { sl_q_complete(user, NULL); }

static shardlimit_notify_callback sl_go_notify(void) { return sl_q_notify; }

// A cgo.Handle as the callback's user pointer: an integer the library never dereferences.
static void *sl_user(uintptr_t handle) { return (void *)handle; }
*/
import "C"

import (
	"context"
	"os"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"unsafe"
)

var goCallback = C.sl_go_callback()

// goNotify is the notify callback of subscriptions (events, warning lines): it queues
// the subscription's waker id as a completion queues its handle.
var goNotify = C.sl_go_notify()

// Wakers are the tags of subscriptions' notifications: ids with the top bit set (a
// cgo.Handle is a small counter, never that large), looked up here. A notification that
// comes after its subscription is gone finds no waker and is dropped.
const wakerBit = ^uintptr(0)>>1 + 1

var (
	wakerSeq atomic.Uintptr
	wakers   sync.Map // id -> chan struct{} (room for one: notifications coalesce)
)

// newWaker registers a waker: the notify callback's user pointer (its id as a pointer
// the library never dereferences), its id, and the channel a notification wakes. Remove it with wakers.Delete(id) once its subscription
// is freed.
func newWaker() (unsafe.Pointer, uintptr, chan struct{}) {
	id := wakerBit | wakerSeq.Add(1)
	c := make(chan struct{}, 1)
	wakers.Store(id, c)
	return C.sl_user(C.uintptr_t(id)), id, c
}

// The dispatch goroutine runs while a limiter is open or a started call has not been
// delivered, and exits otherwise, so that a program (or a test under goleak.VerifyNone)
// that closed every limiter has no goroutine of this package left. The pipe stays open
// for the next one.
var (
	dispatchMu      sync.Mutex
	dispatchPipe    *os.File // the read end, made once
	dispatchErr     error
	dispatchRunning atomic.Bool
	// outstanding counts the started calls whose completion is not delivered yet
	outstanding atomic.Int64
	// openLimiters counts the limiters not closed yet: while one is, dispatch stays (its
	// subscriptions' notifications come through it too)
	openLimiters atomic.Int64
)

// startDispatch makes sure the goroutine that reads the completion queue's pipe runs
// (opening the pipe the first time). The read end is non-blocking, so os.NewFile hands it
// to the network poller: the goroutine parks there and holds no OS thread while it
// waits. A call counts itself in outstanding before (see begin).
func startDispatch() error {
	if dispatchRunning.Load() {
		return nil
	}
	dispatchMu.Lock()
	defer dispatchMu.Unlock()
	if dispatchPipe == nil && dispatchErr == nil {
		fd := C.sl_q_open()
		if fd < 0 {
			dispatchErr = &Error{Code: CodeInternal, Message: "cannot make the pipe that completes started calls (out of file descriptors?)"}
		} else {
			dispatchPipe = os.NewFile(uintptr(fd), "shardlimit-completions")
		}
	}
	if dispatchErr != nil {
		return dispatchErr
	}
	if !dispatchRunning.Load() {
		dispatchRunning.Store(true)
		go dispatch(dispatchPipe)
	}
	return nil
}

// limiterClosed is called once per limiter closed: with none left open, dispatch is
// woken to see whether it may stop.
func limiterClosed() {
	if openLimiters.Add(-1) == 0 && dispatchRunning.Load() {
		C.sl_q_poke()
	}
}

// mayStop, called by dispatch with the queue drained, reports whether it should exit: no
// limiter open and no started call undelivered.
func mayStop() bool {
	if openLimiters.Load() > 0 || outstanding.Load() > 0 {
		return false
	}
	dispatchMu.Lock()
	defer dispatchMu.Unlock()
	dispatchRunning.Store(false)
	if openLimiters.Load() > 0 || outstanding.Load() > 0 {
		// a call started meanwhile and saw dispatch running: stay for it
		dispatchRunning.Store(true)
		return false
	}
	return true
}

// dispatch wakes, for each completed call, the goroutine waiting on it. Each tag is the
// cgo.Handle of that goroutine's channel, which has room for this one send.
func dispatch(wake *os.File) {
	var tags [256]C.uintptr_t
	var b [64]byte
	for {
		if _, err := wake.Read(b[:]); err != nil {
			// the read end is never closed, so this cannot happen short of a broken process
			panic("shardlimit: the completion pipe failed: " + err.Error())
		}
		for {
			n := int(C.sl_q_drain(&tags[0], C.size_t(len(tags))))
			for _, t := range tags[:n] {
				if uintptr(t)&wakerBit != 0 {
					if c, ok := wakers.Load(uintptr(t)); ok {
						select {
						case c.(chan struct{}) <- struct{}{}:
						default: // a wake-up is pending already
						}
					}
					continue
				}
				h := cgo.Handle(uintptr(t))
				h.Value().(chan struct{}) <- struct{}{}
				h.Delete()
				outstanding.Add(-1)
			}
			if n < len(tags) {
				break
			}
		}
		if mayStop() {
			return
		}
	}
}

// starter starts one C call with the Go callback and a user pointer.
type starter func(cb C.shardlimit_callback, user unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result

// begin starts a call with the Go callback: the pending, and the channel its completion
// wakes (room for one). On error no callback will ever run.
func (l *Limiter) begin(start starter) (*C.shardlimit_pending, chan struct{}, error) {
	// counted before startDispatch reads dispatchRunning: a dispatch that stops clears the
	// flag before it reads outstanding, so either it sees this call or this call sees it
	// stopped and starts another
	outstanding.Add(1)
	if err := startDispatch(); err != nil {
		outstanding.Add(-1)
		return nil, nil, err
	}
	// a call in flight from here until its completion is delivered (Close waits for it)
	l.calls.add()
	done := make(chan struct{}, 1)
	h := cgo.NewHandle(done)
	var p *C.shardlimit_pending
	var e *C.shardlimit_error
	if rc := start(goCallback, C.sl_user(C.uintptr_t(h)), &p, &e); rc != C.SHARDLIMIT_OK {
		// no pending: the callback will never run
		h.Delete()
		outstanding.Add(-1)
		l.calls.done()
		return nil, nil, takeError(rc, e)
	}
	if l.afterStart != nil {
		l.afterStart()
	}
	return p, done, nil
}

// await starts a call and parks the goroutine (no OS thread: a channel receive) until the
// call completes or ctx is done. On completion it returns the pending, which the caller
// reads and frees. When ctx ends first the call is cancelled and ctx.Err() returned,
// unless it completed in the meantime: then its result stands.
func (l *Limiter) await(ctx context.Context, start starter) (*C.shardlimit_pending, error) {
	p, done, err := l.begin(start)
	if err != nil {
		return nil, err
	}
	defer l.calls.done()
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

// awaitOrAbandon is await for a call whose result must not be dropped unread (an
// Acquire: Redis may have granted a lease by the time ctx ends, whether it was cancelled
// or its deadline passed). When ctx ends first the call is not cancelled: ctx.Err() is
// returned at once and, when the call completes (within the config's deadline),
// abandoned(p) runs on a goroutine of its own (parked until then: no OS thread), which
// reads p, gives back what it holds and frees it.
func (l *Limiter) awaitOrAbandon(ctx context.Context, start starter, abandoned func(*C.shardlimit_pending)) (*C.shardlimit_pending, error) {
	p, done, err := l.begin(start)
	if err != nil {
		return nil, err
	}
	select {
	case <-done:
		l.calls.done()
		return p, nil
	case <-ctx.Done():
		go func() {
			<-done
			l.calls.done()
			abandoned(p)
		}()
		return nil, ctx.Err()
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

// stringOf reads a completed call's JSON answer (found is false for no override) and
// frees the pending.
func stringOf(p *C.shardlimit_pending) (text string, found bool, err error) {
	defer C.shardlimit_pending_free(p)
	var f C.bool
	var s C.shardlimit_string
	var e *C.shardlimit_error
	if rc := C.shardlimit_pending_string(p, &f, &s, &e); rc != C.SHARDLIMIT_OK {
		return "", false, takeError(rc, e)
	}
	if !bool(f) {
		return "", false, nil
	}
	return takeString(&s), true, nil
}
