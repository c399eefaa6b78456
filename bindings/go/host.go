package shardlimit

/*
#include <stdlib.h>
#include "shardlimit.h"

// The out-parameters of the host transport's calls, which are all made under its mu: in
// C memory, once per transport (a Go variable whose address goes to C lives on the heap,
// one allocation per call; the decision is some 500 bytes).
typedef struct {
	uint32_t step;
	uint64_t id;
	size_t shard;
	size_t n;
	shardlimit_error *err;
	shardlimit_decision decision;
} host_scratch;
*/
import "C"

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Transport says how a limiter's checks reach Redis.
type Transport string

const (
	// TransportDefault: the library's choice, TransportHost for a limiter whose shards it
	// serves (standalone Redis over plain TCP), else TransportThread.
	TransportDefault Transport = ""
	// TransportHost: Check of a named policy moves its bytes on Go's own network poller,
	// one net.Conn per shard, with the core's sans-I/O state machine (shardlimit_host_*)
	// deciding: no thread hop per decision. Standalone Redis shards over plain TCP only
	// (NewFromJSON returns a config error otherwise). What it cannot do (multi-limit,
	// shadow, local admission, overrides policies, a reshard handoff) and every other
	// call take the thread path.
	TransportHost Transport = "host"
	// TransportThread: every call goes through the library's own I/O thread (the C ABI's
	// _start calls), the goroutine parked until its completion is queued back.
	TransportThread Transport = "thread"
)

// WithTransport chooses how the limiter's checks reach Redis (TransportDefault when not
// given: the host transport where it serves the limiter's shards).
func WithTransport(t Transport) Option {
	return func(o *options) { o.transport, o.transportSet = t, true }
}

const (
	hostBackoffMin = 20 * time.Millisecond
	// as the core's circuit probe (250 ms): a shard back from a restart is connected
	// again within it, or at once when a check comes once its circuit has closed
	hostBackoffMax = 250 * time.Millisecond
	// how soon a deadline is looked at again when the socket still held bytes
	hostRecheck = 200 * time.Microsecond
	// completions taken from the library per call (the rest come on the next)
	hostCompletions = 256
	hostReadBuf     = 64 << 10
	hostWriteBuf    = 64 << 10
)

// defaultTransport is the transport of a limiter made without WithTransport
// (SHARDLIMIT_TEST_TRANSPORT in the tests). TransportDefault tries the host transport and
// takes the thread path for a limiter it cannot serve (memory, TLS, Cluster, Sentinel,
// Unix sockets): measured pinned to one CPU against the thread path, the host transport
// had 0.67-0.88x its single-goroutine p50 and 0.97-1.03x its decisions/s at 64
// goroutines (docs/notes/2026-12-measurements.md).
var defaultTransport = TransportDefault

// hostTo starts the host transport of a limiter just made with opts, when they ask.
func hostTo(opts []Option) func(*Limiter, error) (*Limiter, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if !o.transportSet {
		o.transport = defaultTransport
	}
	// only an explicit TransportHost makes a limiter the host transport cannot serve an error
	explicit := o.transport == TransportHost
	return func(l *Limiter, err error) (*Limiter, error) {
		if err != nil || o.transport == TransportThread {
			return l, err
		}
		if o.transport != TransportHost && o.transport != TransportDefault {
			l.Close()
			return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument `transport`: " + strconv.Quote(string(o.transport)) + " is not \"\", \"host\" or \"thread\""}
		}
		t, err := newHostTransport(l.h.Load().p)
		var se *Error
		if err != nil && !explicit && errors.As(err, &se) && se.Code == CodeConfig {
			return l, nil // not for this limiter's shards: the default path
		}
		if err != nil {
			l.Close()
			return nil, err
		}
		t.stats = o.hostStats
		l.host.Store(t)
		return l, nil
	}
}

// hostTransport owns one connection per shard and the library's state machines over
// them (shardlimit_host). mu serialises every call into the handle and the waiters: a
// check records its waiter under the same lock as it is queued, so the reader that
// completes it always finds it.
type hostTransport struct {
	mu      sync.Mutex
	h       *C.shardlimit_host
	waiters map[uint64]*hostWaiter
	shards  []*hostShard
	// completions from the library: C memory (an entry holds an error handle)
	comps *C.shardlimit_host_completion
	// sc: the calls' out-parameters, C memory (under mu)
	sc     *C.host_scratch
	timer  *time.Timer
	armed  bool // the timer is set for the next deadline
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
	// connectTimeout is the config's timeout: how long a dial may take
	connectTimeout time.Duration
	// stats, set by tests only (under mu)
	stats *hostStats
	// woken: how many checks the replies read since the last write woke; queued: how
	// many checks were queued since then (under mu)
	woken, queued int
	// ctx ends when the transport closes (a dial in progress stops)
	ctx    context.Context
	cancel context.CancelFunc
}

type hostShard struct {
	index int
	addr  string
	conn  net.Conn // nil while not connected (under mu)
	// writing: a goroutine is in flush for this shard (under mu); the checks queued
	// meanwhile go out in its next write
	writing bool
	// more: while writing, a check was queued or the reader asked for a flush (under mu):
	// the flush asks the library again before it ends
	more bool
	wbuf []byte // flush's buffer (one flush at a time)
	// readBuf is the reader's (run's) buffer
	readBuf []byte
	// reading: the reader is taking bytes from the socket, or has taken bytes it has not
	// handed to the library yet (it clears it under mu): the shard is not silent
	reading atomic.Bool
	// sleeping: run waits out a reconnect back-off (under mu); kick ends it
	sleeping bool
	kick     chan struct{}
}

// hostStats counts, for tests, what the host transport did (under its mu).
type hostStats struct {
	pending, decided, delegated int
}

// hostWaiter is a check waiting for its completion: the reader writes d and err in place
// (a Decision is some 700 bytes: not copied through the channel), then signals ch.
type hostWaiter struct {
	ch     chan struct{} // room for one
	policy string
	d      Decision
	err    error
}

var waiterPool = sync.Pool{New: func() any { return &hostWaiter{ch: make(chan struct{}, 1)} }}

// done hands w its result (mu held).
func (w *hostWaiter) done(err error) {
	w.err = err
	w.ch <- struct{}{}
}

func newHostTransport(lim *C.shardlimit_limiter) (*hostTransport, error) {
	var h *C.shardlimit_host
	var e *C.shardlimit_error
	if rc := C.shardlimit_host_new(lim, &h, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	t := &hostTransport{
		h:       h,
		waiters: make(map[uint64]*hostWaiter),
		done:    make(chan struct{}),
		comps:   (*C.shardlimit_host_completion)(C.calloc(hostCompletions, C.size_t(unsafe.Sizeof(C.shardlimit_host_completion{})))),
		sc:      (*C.host_scratch)(C.calloc(1, C.size_t(unsafe.Sizeof(C.host_scratch{})))),
	}
	n := int(C.shardlimit_host_shard_count(h))
	for i := 0; i < n; i++ {
		var host C.shardlimit_string
		var port C.uint16_t
		var us C.uint64_t
		if rc := C.shardlimit_host_address(h, C.size_t(i), &host, &port, &us, &e); rc != C.SHARDLIMIT_OK {
			C.shardlimit_host_free(h)
			C.free(unsafe.Pointer(t.comps))
			C.free(unsafe.Pointer(t.sc))
			return nil, takeError(rc, e)
		}
		name := takeString(&host)
		t.connectTimeout = time.Duration(us) * time.Microsecond
		t.shards = append(t.shards, &hostShard{
			index: i,
			addr:  net.JoinHostPort(name, strconv.Itoa(int(port))),
			wbuf:  make([]byte, hostWriteBuf),
			kick:  make(chan struct{}, 1),
		})
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.timer = time.AfterFunc(time.Hour, t.onTimer)
	t.timer.Stop()
	// the first connects are under way: checks made until they are up wait for them
	t.mu.Lock()
	for _, s := range t.shards {
		C.shardlimit_host_connecting(h, C.size_t(s.index), nil)
	}
	t.armLocked()
	t.mu.Unlock()
	for _, s := range t.shards {
		t.wg.Add(1)
		go t.run(s)
	}
	return t, nil
}

// check is a Check on the host transport; ok is false when the check needs the
// limiter's own path (the library said Delegate).
func (t *hostTransport) check(ctx context.Context, key, policy string, cost uint64, afterStart func()) (d Decision, err error, ok bool) {
	kp, kn := cStr(key)
	pp, pn := cStr(policy)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return Decision{}, ErrClosed, true
	}
	sc := t.sc
	sc.err = nil
	rc := C.shardlimit_host_check(t.h, kp, kn, pp, pn, C.uint64_t(cost), &sc.step, &sc.id, &sc.shard, &sc.decision, &sc.err)
	if rc != C.SHARDLIMIT_OK {
		e := sc.err
		t.mu.Unlock()
		return Decision{}, takeError(rc, e), true
	}
	step, id, shard := sc.step, sc.id, sc.shard
	if t.stats != nil {
		t.count(step)
	}
	switch step {
	case C.SHARDLIMIT_HOST_DECIDED:
		d = decisionFromC(&sc.decision, policy)
		t.mu.Unlock()
		return d, nil, true
	case C.SHARDLIMIT_HOST_DELEGATE:
		t.mu.Unlock()
		return Decision{}, nil, false
	}
	w := waiterPool.Get().(*hostWaiter)
	w.policy = policy
	t.waiters[uint64(id)] = w
	t.queued++
	s := t.shards[int(shard)]
	if s.sleeping {
		// the shard was down with its circuit closed: the check waits for a connect made
		// now, not after the back-off
		s.sleeping = false
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	if s.writing || s.conn == nil {
		// a flush in progress takes it in its next write (or the connect, its first)
		s.more = true
		t.mu.Unlock()
	} else {
		s.writing = true
		burst := t.woken > 1
		t.mu.Unlock()
		if burst {
			t.gather(s)
		}
		t.flush(s)
	}
	if afterStart != nil {
		afterStart()
	}
	select {
	case <-w.ch:
	case <-ctx.Done():
		t.mu.Lock()
		_, waiting := t.waiters[uint64(id)]
		delete(t.waiters, uint64(id))
		t.mu.Unlock()
		if waiting {
			// its reply (if any) finds no waiter; the check may still have been counted
			w.policy = ""
			waiterPool.Put(w)
			return Decision{}, ctx.Err(), true
		}
		<-w.ch // completed first: its result stands
	}
	d, err = w.d, w.err
	w.policy, w.d, w.err = "", Decision{}, nil
	waiterPool.Put(w)
	return d, err, true
}

func (t *hostTransport) count(step C.uint32_t) {
	switch step {
	case C.SHARDLIMIT_HOST_DECIDED:
		t.stats.decided++
	case C.SHARDLIMIT_HOST_DELEGATE:
		t.stats.delegated++
	default:
		t.stats.pending++
	}
}

// inFlight is how many checks wait for their reply in the library.
func (t *hostTransport) inFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0
	}
	return int(C.shardlimit_host_in_flight(t.h))
}

// up reports whether shard i's connection is made (or being made).
func (t *hostTransport) up(i int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.closed && !bool(C.shardlimit_host_is_down(t.h, C.size_t(i)))
}

// armLocked sets the timer for the next deadline, if anything waits (mu held). Deadlines
// only come later than the ones already set (every one is now + the config's timeout),
// so a timer set stays the earliest until it fires.
func (t *hostTransport) armLocked() {
	if t.closed {
		return
	}
	var has C.bool
	var us C.uint64_t
	if rc := C.shardlimit_host_next_deadline_us(t.h, &has, &us, nil); rc != C.SHARDLIMIT_OK || !bool(has) {
		return
	}
	t.armed = true
	t.timer.Reset(time.Duration(us) * time.Microsecond)
}

// onTimer looks at the deadlines. A deadline is a shard's silence, never this process's
// business: on a busy process the timer may run while the replies it waits for sit in a
// socket, or in a reader that has not had the CPU to hand them in. Those are read first:
// while any shard's socket holds bytes or its reader holds some, the timer comes again
// shortly instead.
func (t *hostTransport) onTimer() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.armed = false
	if t.closed {
		return
	}
	for _, s := range t.shards {
		if s.conn != nil && (unread(s.conn) || s.reading.Load()) {
			t.armed = true
			t.timer.Reset(hostRecheck)
			return
		}
	}
	var n C.size_t
	var e *C.shardlimit_error
	rc := C.shardlimit_host_timeout(t.h, t.comps, hostCompletions, &n, &e)
	t.deliverLocked(rc, e, n)
	for _, s := range t.shards {
		if s.conn != nil && bool(C.shardlimit_host_is_down(t.h, C.size_t(s.index))) {
			// a call's deadline passed: its late reply would not be trusted. The reader
			// sees the close and connects again.
			s.conn.Close()
		}
	}
	t.armLocked()
}

// deliverLocked hands the n completions in t.comps (from a call that returned rc) and
// any the library still queues to their waiters (mu held).
func (t *hostTransport) deliverLocked(rc C.shardlimit_result, e *C.shardlimit_error, n C.size_t) {
	for {
		if rc != C.SHARDLIMIT_OK {
			// only a bug (a bad argument) gets here; the waiters then fail by deadline
			_ = takeError(rc, e)
			return
		}
		comps := unsafe.Slice(t.comps, int(n))
		for i := range comps {
			c := &comps[i]
			var err error
			if c.result != C.SHARDLIMIT_OK {
				err = takeError(c.result, c.error)
				c.error = nil
			}
			w, ok := t.waiters[uint64(c.id)]
			if !ok {
				continue // its caller has gone (ctx done)
			}
			delete(t.waiters, uint64(c.id))
			if err == nil {
				w.d.fromC(&c.decision, w.policy)
			}
			t.woken++
			w.done(err)
		}
		if int(n) < hostCompletions {
			return
		}
		t.sc.err = nil
		rc = C.shardlimit_host_completions(t.h, t.comps, hostCompletions, &t.sc.n, &t.sc.err)
		n, e = t.sc.n, t.sc.err
	}
}

// hostGatherRounds bounds how many times a check that starts a write yields first.
const hostGatherRounds = 8

// gather lets the checkers that the last replies woke with this one queue their checks
// before it writes (s.writing set, so they only queue), so that one write, one batch call,
// carries them: it yields while a round brought more checks and fewer have come back than
// were woken, at most hostGatherRounds times. On one CPU they all wait for this goroutine
// (and a round can end early when a cgo call or a syscall hands the CPU over); a lone
// caller (one check woken) never gets here and writes at once.
func (t *hostTransport) gather(s *hostShard) {
	last := -1
	for i := 0; i < hostGatherRounds; i++ {
		runtime.Gosched()
		t.mu.Lock()
		q, w := t.queued, t.woken
		t.mu.Unlock()
		if q == last || q >= w {
			return
		}
		last = q
	}
}

// startFlush writes what the library has for shard s, unless a flush is in progress (which
// takes it in its next write).
func (t *hostTransport) startFlush(s *hostShard) {
	t.mu.Lock()
	if s.writing || s.conn == nil || t.closed {
		s.more = s.more || s.writing
		t.mu.Unlock()
		return
	}
	s.writing = true
	t.mu.Unlock()
	t.flush(s)
}

// flush writes what the library has for shard s until it has nothing more (s.writing set
// by the caller): the checks that come while a write is in flight go out together in the
// next one, written by this goroutine, so 64 goroutines share few writes. It clears
// s.writing under the same lock as the transmit that found nothing, or as its look at
// s.more after a write that took all the library had, so a check queued after it starts a
// flush of its own.
func (t *hostTransport) flush(s *hostShard) {
	for {
		t.mu.Lock()
		conn := s.conn
		if t.closed || conn == nil {
			s.writing = false
			t.mu.Unlock()
			return
		}
		s.more = false
		t.sc.err = nil
		rc := C.shardlimit_host_transmit(t.h, C.size_t(s.index), (*C.uint8_t)(unsafe.Pointer(&s.wbuf[0])), hostWriteBuf, &t.sc.n, &t.sc.err)
		n, e := t.sc.n, t.sc.err
		if rc != C.SHARDLIMIT_OK || n == 0 {
			s.writing = false
			t.mu.Unlock()
			if rc != C.SHARDLIMIT_OK {
				_ = takeError(rc, e)
			}
			return
		}
		t.woken, t.queued = 0, 0
		if !t.armed {
			// the checks handed out have a deadline from now (a check only queued has
			// none): the timer must run for them
			t.armLocked()
		}
		t.mu.Unlock()
		if _, err := conn.Write(s.wbuf[:n]); err != nil {
			conn.Close() // the reader sees it and reports the close
		}
		if n < hostWriteBuf {
			// the library handed out all it had: unless a check (or the reader) came
			// meanwhile, there is nothing to ask it for
			t.mu.Lock()
			if !s.more {
				s.writing = false
				t.mu.Unlock()
				return
			}
			t.mu.Unlock()
		}
	}
}

// run connects shard s, reads it and feeds the library until the connection ends, then
// connects again until the transport is closed: at once after a connection that worked
// (checks made meanwhile wait for it), with backoff after one that did not (checks made
// meanwhile fail at once by their policies' on_error). newHostTransport has told the
// library that the first connect is under way.
func (t *hostTransport) run(s *hostShard) {
	defer t.wg.Done()
	backoff := time.Duration(0)
	s.readBuf = make([]byte, hostReadBuf)
	connecting := true
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return
		}
		// (again when the library is connecting already: the dial starts only now, this
		// goroutine may have waited for a CPU, and the connect's clock starts with it)
		C.shardlimit_host_connecting(t.h, C.size_t(s.index), nil)
		if !t.armed {
			t.armLocked()
		}
		t.mu.Unlock()
		d := net.Dialer{Timeout: t.connectTimeout}
		conn, err := d.DialContext(t.ctx, "tcp", s.addr)
		if err == nil {
			t.mu.Lock()
			if t.closed {
				t.mu.Unlock()
				conn.Close()
				return
			}
			if bool(C.shardlimit_host_is_down(t.h, C.size_t(s.index))) {
				// the connect outlived its deadline (the timer failed its checks)
				err = errors.New("the connect took longer than the config's timeout")
			} else {
				C.shardlimit_host_connected(t.h, C.size_t(s.index), nil)
				s.conn = conn
			}
			t.mu.Unlock()
		}
		worked := false
		if err == nil {
			t.startFlush(s) // the log-in, and what waited for the connection
			worked, err = t.read(s, conn)
		}
		if conn != nil {
			conn.Close()
		}
		if worked {
			backoff = 0
		} else {
			backoff = min(max(backoff*2, hostBackoffMin), hostBackoffMax)
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return
		}
		s.conn = nil
		why := "the connection to Redis failed: " + err.Error()
		wp, wn := cStr(why)
		var n C.size_t
		var e *C.shardlimit_error
		rc := C.shardlimit_host_closed(t.h, C.size_t(s.index), wp, wn, t.comps, hostCompletions, &n, &e)
		t.deliverLocked(rc, e, n)
		// a connection that worked: connect again now, the checks meanwhile wait for it
		connecting = worked
		if connecting {
			C.shardlimit_host_connecting(t.h, C.size_t(s.index), nil)
		}
		t.mu.Unlock()
		if connecting {
			continue
		}
		t.mu.Lock()
		s.sleeping = true
		select {
		case <-s.kick: // (a stale one)
		default:
		}
		t.mu.Unlock()
		// jittered down to half, as the core's own reconnects
		wait := backoff/2 + rand.N(backoff/2+1)
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-s.kick:
			// a check is waiting for this connect (the library is connecting already)
			timer.Stop()
		case <-t.done:
			timer.Stop()
			return
		}
		t.mu.Lock()
		s.sleeping = false
		t.mu.Unlock()
	}
}

// read feeds what conn reads to the library until it fails, or the library gives the
// connection up (bytes it cannot trust). worked: replies were taken on it.
func (t *hostTransport) read(s *hostShard, conn net.Conn) (worked bool, err error) {
	buf := s.readBuf
	var raw syscall.RawConn
	if sc, ok := conn.(syscall.Conn); ok {
		raw, _ = sc.SyscallConn()
	}
	for {
		var r int
		if raw != nil {
			r, err = rawRead(raw, buf, &s.reading)
		} else {
			s.reading.Store(true)
			r, err = conn.Read(buf)
		}
		if r <= 0 {
			s.reading.Store(false)
		}
		if r > 0 {
			if h := hostReadHook.Load(); h != nil {
				(*h)(hookBeforeInput)
			}
			t.mu.Lock()
			t.sc.err = nil
			rc := C.shardlimit_host_input(t.h, C.size_t(s.index), (*C.uint8_t)(unsafe.Pointer(&buf[0])), C.size_t(r), t.comps, hostCompletions, &t.sc.n, &t.sc.err)
			woke := t.woken
			t.deliverLocked(rc, t.sc.err, t.sc.n)
			woke = t.woken - woke
			s.reading.Store(false)
			down := bool(C.shardlimit_host_is_down(t.h, C.size_t(s.index)))
			t.mu.Unlock()
			if woke > 0 {
				// the checks just completed run first (on one CPU they wait for this
				// goroutine): their callers have their decisions before this reader's
				// own remaining work, and the next checks go out sooner
				runtime.Gosched()
			}
			if down {
				return false, errors.New("a reply shardlimit could not trust (the connection was dropped)")
			}
			worked = true
			t.startFlush(s) // a NOSCRIPT reply sends its check again
		}
		if err != nil {
			return worked, err
		}
	}
}

// close fails the checks in flight (by their policies' on_error), stops the goroutines
// and frees the handle.
func (t *hostTransport) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.done)
	t.cancel()
	t.timer.Stop()
	for _, s := range t.shards {
		if s.conn != nil {
			s.conn.Close()
			s.conn = nil
		}
		why := "the limiter was closed"
		wp, wn := cStr(why)
		var n C.size_t
		var e *C.shardlimit_error
		rc := C.shardlimit_host_closed(t.h, C.size_t(s.index), wp, wn, t.comps, hostCompletions, &n, &e)
		t.deliverLocked(rc, e, n)
	}
	// a check that the library never completes cannot be left waiting
	for id, w := range t.waiters {
		delete(t.waiters, id)
		w.done(ErrClosed)
	}
	t.mu.Unlock()
	t.wg.Wait()
	C.shardlimit_host_free(t.h)
	C.free(unsafe.Pointer(t.comps))
	C.free(unsafe.Pointer(t.sc))
}
