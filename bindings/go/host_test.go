package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SHARDLIMIT_TEST_TRANSPORT=thread runs the whole suite with the I/O thread as the
// default (=host: with the host transport, as TransportDefault has it on plain shards).
func init() {
	if v := os.Getenv("SHARDLIMIT_TEST_TRANSPORT"); v != "" {
		defaultTransport = Transport(v)
	}
}

func withHostStats(s *hostStats) Option { return func(o *options) { o.hostStats = s } }

// hostLimiter is a limiter on the host transport over r with the given policies and
// timeout, closed when the test ends.
func hostLimiter(t *testing.T, r *redisServer, timeoutMs int, policies string, opts ...Option) *Limiter {
	t.Helper()
	cfg := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":%d,"policies":{%s}}`,
		r.Port, timeoutMs, policies)
	l, err := NewFromJSON(cfg, append([]Option{WithTransport(TransportHost)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// waitFor polls cond (readiness, not a race) for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// untilRedisDecides checks until the host transport is connected again and Redis
// decides (a check made while it reconnects fails by its policy's on_error).
func untilRedisDecides(t *testing.T, l *Limiter, key, policy string) Decision {
	t.Helper()
	var d Decision
	waitFor(t, "a decision from Redis", func() bool {
		var err error
		d, err = l.Check(context.Background(), key, policy, 1)
		return err == nil && d.Source == SourceRedis
	})
	return d
}

// The vectors decide the same on the host transport, and it is the host path that
// decided them (not the limiter's own path).
func TestHostVectorsOnRedis(t *testing.T) {
	r := startRedis(t)
	stats := &hostStats{}
	n := replayVectors(t, SourceRedis, func(policies string, i int) string {
		return fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,
			"key_prefix":"hvec%d:","policies":%s}`, r.Port, i, policies)
	}, WithTransport(TransportHost), withHostStats(stats))
	if want := totalVectorSteps(t); n != want {
		t.Fatalf("replayed %d steps of %d", n, want)
	}
	if stats.pending == 0 {
		t.Fatalf("no check went through the host transport: %+v", stats)
	}
	t.Logf("host transport: %+v", stats)
}

// 64 goroutines share one key: exactly the limit is admitted, each caller gets its own
// answer (the remaining counts are all different), and the checks share writes.
func TestHostConcurrentChecks(t *testing.T) {
	r := startRedis(t)
	stats := &hostStats{}
	l := hostLimiter(t, r, 2000, `"api":{"algorithm":"fixed_window","limit":1000,"window":"1h"}`, withHostStats(stats))
	ctx := context.Background()
	var mu sync.Mutex
	remaining := map[uint64]bool{}
	allowed, denied := 0, 0
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				d, err := l.Check(ctx, "shared", "api", 1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if d.Allowed {
					allowed++
					if remaining[d.Remaining] {
						t.Errorf("two callers got remaining %d", d.Remaining)
					}
					remaining[d.Remaining] = true
				} else {
					denied++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if allowed != 1000 || denied != 280 {
		t.Fatalf("allowed %d, denied %d; want 1000 and 280", allowed, denied)
	}
	if stats.pending != 1280-stats.decided || stats.delegated != 0 {
		t.Fatalf("stats %+v", stats)
	}
	// and the default path sees the same state
	plain, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":1000,"window":"1h"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if d, err := plain.Check(ctx, "shared", "api", 1); err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("default path after: %+v %v", d, err)
	}
}

// What the host transport cannot do goes the limiter's own way; bad input is an error
// naming it; a transport name that does not exist, or a limiter without Redis, is refused.
func TestHostDelegatesAndRefuses(t *testing.T) {
	r := startRedis(t)
	stats := &hostStats{}
	l := hostLimiter(t, r, 2000, `"multi":"5/minute; 50/hour","api":"10/minute"`, withHostStats(stats))
	ctx := context.Background()
	d, err := l.Check(ctx, "k", "multi", 1)
	if err != nil || !d.Allowed || len(d.Quotas) != 2 || stats.delegated != 1 {
		t.Fatalf("multi-limit: %+v %v %+v", d, err, stats)
	}
	if _, err := l.Check(ctx, "k", "nope", 1); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
	if _, err := l.Check(ctx, "", "api", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := l.Check(ctx, "k", "api", 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("cost 0: %v", err)
	}
	if _, err := NewFromJSON(`{"policies":{"api":"10/minute"}}`, WithTransport(TransportHost)); !errors.Is(err, ErrConfig) {
		t.Fatalf("memory engine: %v", err)
	}
	if _, err := NewFromJSON(r.config(`"api":"10/minute"`), WithTransport("uv")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("transport uv: %v", err)
	}
}

// Without WithTransport a limiter on plain Redis shards checks on the host transport, one
// it cannot serve (memory) takes the thread path without an error, and TransportThread
// keeps Check on the I/O thread.
func TestDefaultTransportIsHostWhereItServes(t *testing.T) {
	if os.Getenv("SHARDLIMIT_TEST_TRANSPORT") != "" {
		t.Skip("SHARDLIMIT_TEST_TRANSPORT sets another default")
	}
	r := startRedis(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		opts []Option
		host bool
	}{
		{"default", nil, true},
		{"explicit default", []Option{WithTransport(TransportDefault)}, true},
		{"thread", []Option{WithTransport(TransportThread)}, false},
	} {
		l, err := NewFromJSON(r.config(`"api":"10/minute"`), c.opts...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := l.host.Load() != nil; got != c.host {
			t.Fatalf("%s: host transport %v, want %v", c.name, got, c.host)
		}
		if d, err := l.Check(ctx, "k-"+c.name, "api", 1); err != nil || !d.Allowed || d.Source != SourceRedis {
			t.Fatalf("%s: %+v %v", c.name, d, err)
		}
		l.Close()
	}
	l, err := NewFromJSON(`{"policies":{"api":"10/minute"}}`)
	if err != nil || l.host.Load() != nil {
		t.Fatalf("memory engine by default: %v", err)
	}
	l.Close()
}

// A Redis that stops answering: each check ends at the config's deadline by its
// policy's on_error, the connection is dropped (its late replies are not trusted), and
// checks decide on Redis again once it answers. A caller whose ctx ends first gets
// ctx.Err() at once.
func TestHostDeadlines(t *testing.T) {
	r := startRedis(t)
	l := hostLimiter(t, r, 200, `"open":{"algorithm":"fixed_window","limit":10,"window":"1h","on_error":"open"},
		"strict":{"algorithm":"fixed_window","limit":10,"window":"1h","on_error":"error"}`)
	untilRedisDecides(t, l, "d", "open")
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = r.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	ctx := context.Background()
	start := time.Now()
	d, err := l.Check(ctx, "d", "open", 1)
	if err != nil || !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("open: %+v %v", d, err)
	}
	if took := time.Since(start); took < 150*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the deadline took %v", took)
	}
	waitFor(t, "connection back", func() bool { return l.host.Load().inFlight() == 0 })
	_, err = l.Check(ctx, "d", "strict", 1)
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrConnection) && !errors.Is(err, ErrUnavailable) {
		t.Fatalf("strict: %v", err)
	}
	// connected again (the stopped server's backlog accepts): a check waits for Redis
	waitFor(t, "a connection", func() bool { return l.host.Load().up(0) })
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := l.Check(cctx, "d", "open", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx: %v", err)
	}
	if took := time.Since(start); took > 150*time.Millisecond {
		t.Fatalf("ctx.Err() after %v", took)
	}
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	if d := untilRedisDecides(t, l, "d", "open"); !d.Allowed {
		t.Fatalf("after: %+v", d)
	}
}

// Redis killed with checks in flight: every one ends at once (the close, not the
// deadline) by its policy's on_error; Close then leaves no goroutine behind.
func TestHostRedisKilledMidFlight(t *testing.T) {
	base := runtime.NumGoroutine()
	r := startRedis(t)
	cfg := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":5000,"policies":{
		"open":{"algorithm":"fixed_window","limit":10,"window":"1h","on_error":"open"},
		"strict":{"algorithm":"fixed_window","limit":10,"window":"1h","on_error":"error"}}}`, r.Port)
	l, err := NewFromJSON(cfg, WithTransport(TransportHost))
	if err != nil {
		t.Fatal(err)
	}
	untilRedisDecides(t, l, "k", "open")
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	type out struct {
		policy string
		d      Decision
		err    error
	}
	results := make(chan out, 16)
	for i := 0; i < 16; i++ {
		policy := "open"
		if i%2 == 1 {
			policy = "strict"
		}
		go func() {
			d, err := l.Check(context.Background(), fmt.Sprint("k", i), policy, 1)
			results <- out{policy, d, err}
		}()
	}
	waitFor(t, "16 checks in flight", func() bool { return l.host.Load().inFlight() == 16 })
	start := time.Now()
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		o := <-results
		if o.policy == "open" && (o.err != nil || !o.d.Allowed || o.d.Source != SourceFallback) {
			t.Errorf("open: %+v %v", o.d, o.err)
		}
		if o.policy == "strict" && !errors.Is(o.err, ErrConnection) {
			t.Errorf("strict: %v (want the connection's failure)", o.err)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the checks ended %v after the kill (the deadline is 5 s)", took)
	}
	l.Close()
	goroutinesBack(t, base+2) // startRedis's waiter, and the completion dispatcher
}

// A connection the server closes (CLIENT KILL): the transport connects again.
func TestHostReconnects(t *testing.T) {
	r := startRedis(t)
	l := hostLimiter(t, r, 2000, `"api":{"algorithm":"fixed_window","limit":100,"window":"1h"}`)
	d := untilRedisDecides(t, l, "r", "api")
	c, rd, err := rawRedis(r.Port, 2*time.Second, "CLIENT KILL TYPE normal SKIPME yes\r\n")
	if err != nil {
		t.Fatal(err)
	}
	line, err := rd.ReadString('\n')
	c.Close()
	if err != nil || line[0] != ':' || line == ":0\r\n" {
		t.Fatalf("CLIENT KILL: %q %v", line, err)
	}
	d2 := untilRedisDecides(t, l, "r", "api")
	if d2.Remaining >= d.Remaining {
		t.Fatalf("remaining %d then %d: the state is not Redis's", d.Remaining, d2.Remaining)
	}
}

// A server that answers what nobody asked (a hostile or broken one: the real Redis cannot
// misbehave on purpose): the check fails, nobody gets another caller's answer, and the
// connection is closed.
func TestHostHostileReply(t *testing.T) {
	closed := make(chan error, 4)
	l := hostileShard(t, 2000, func(c net.Conn, buf []byte) {
		// a reply of the wrong shape, then one nobody asked for
		_, _ = c.Write([]byte(":1\r\n:2\r\n"))
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		for {
			if _, err := c.Read(buf); err != nil {
				closed <- err
				return
			}
		}
	})
	var d Decision
	var err error
	waitFor(t, "a check sent to the server", func() bool {
		d, err = l.Check(context.Background(), "k", "strict", 1)
		return err != nil && !errors.Is(err, ErrConnection)
	})
	if !errors.Is(err, ErrScript) && !errors.Is(err, ErrIO) && !errors.Is(err, ErrInternal) {
		t.Logf("the wrong reply: %v", err)
	}
	if d.Allowed {
		t.Fatalf("a decision from a hostile reply: %+v", d)
	}
	select {
	case err := <-closed:
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the transport kept the connection after a reply nobody asked for")
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server saw no close")
	}
}

// (Close with checks in flight: close_inflight_test.go, for both transports.)

// A deadline is the shard's silence, never this process's slowness: a process short of
// CPU runs its deadline timer late, with the replies it waits for already come. The reader
// is held (hostReadHook) where such a process would be slow, past the deadline (50 ms)
// three times over, then let go: every check is decided by Redis. Held before it reads,
// the replies wait in the socket (the timer asks it, FIONREAD); held after it read them,
// they wait in the reader (its reading flag says so).
func TestHostLateTimerDoesNotFailRepliesWaitingToBeRead(t *testing.T) {
	for _, stage := range []int{hookBeforeRead, hookBeforeInput} {
		name := map[int]string{hookBeforeRead: "in the socket", hookBeforeInput: "in the reader"}[stage]
		t.Run(name, func(t *testing.T) {
			r := startRedis(t)
			l := hostLimiter(t, r, 50, `"open":{"algorithm":"fixed_window","limit":1000,"window":"1h","on_error":"open"}`)
			untilRedisDecides(t, l, "warm", "open")
			ht := l.host.Load()

			var hold sync.Once
			held := make(chan struct{})
			gate := make(chan struct{})
			hook := func(s int) {
				if s == stage {
					hold.Do(func() { close(held); <-gate })
				}
			}
			hostReadHook.Store(&hook)
			defer hostReadHook.Store(nil)
			released := false
			defer func() {
				if !released {
					close(gate)
				}
			}()

			// (one check in the reader's case: its one reply is all the reader takes, and
			// the socket is left empty)
			n := 32
			if stage == hookBeforeInput {
				n = 1
			}
			results := make(chan error, n)
			for i := 0; i < n; i++ {
				go func(i int) {
					d, err := l.Check(context.Background(), fmt.Sprintf("late-%d", i), "open", 1)
					if err == nil && d.Source != SourceRedis {
						err = fmt.Errorf("check %d: source %v", i, d.Source)
					}
					results <- err
				}(i)
			}
			select {
			case <-held:
			case <-time.After(5 * time.Second):
				t.Fatal("the reader never saw a reply")
			}
			ht.mu.Lock()
			conn := ht.shards[0].conn
			ht.mu.Unlock()
			if stage == hookBeforeRead {
				waitFor(t, "the replies in the socket", func() bool { return unread(conn) })
			} else if unread(conn) {
				t.Fatal("bytes in the socket: the reader's own flag is not what is tested")
			}
			// the timer is due 50 ms after the checks were written; the reader is held
			// for three deadlines
			time.Sleep(150 * time.Millisecond)
			select {
			case err := <-results:
				t.Fatalf("a check ended while its reply waited to be read: %v", err)
			default:
			}
			released = true
			close(gate)
			for i := 0; i < n; i++ {
				if err := <-results; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// The reply bounds hold on the host transport: a server whose reply never ends (past the
// 1 MiB a check's reply may take) fails the check and is dropped, having sent a bounded
// amount; the process reads it into a fixed buffer and the
// library keeps at most the bound.
func TestHostEndlessReplyIsBounded(t *testing.T) {
	for _, c := range []struct{ name, head, unit string }{
		{"a line that never ends", "+", "x"},
		{"an array of a billion integers", "*1000000000\r\n", ":1\r\n"},
		{"a string of a billion bytes", "$1000000000\r\n", "x"},
		// announced within the bound, past it once its elements are read
		{"an array that grows past 1 MiB", "*200000\r\n", ":1111111\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) { endlessReply(t, c.head, c.unit) })
	}
}

func endlessReply(t *testing.T, head, unit string) {
	sent := make(chan int64, 4)
	l := hostileShard(t, 5000, func(c net.Conn, _ []byte) {
		chunk := []byte(strings.Repeat(unit, (64<<10)/len(unit)))
		var total int64
		if _, err := c.Write([]byte(head)); err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		// at most 1 GiB: the client closes long before, or the test fails
		for total < 1<<30 {
			w, err := c.Write(chunk)
			total += int64(w)
			if err != nil {
				break
			}
		}
		sent <- total
	})
	ht := l.host.Load()
	waitFor(t, "connected", func() bool {
		ht.mu.Lock()
		defer ht.mu.Unlock()
		return ht.shards[0].conn != nil
	})
	start := time.Now()
	d, err := l.Check(context.Background(), "k", "strict", 1)
	if err == nil || d.Allowed {
		t.Fatalf("a decision from an endless reply: %+v %v", d, err)
	}
	if errors.Is(err, ErrTimeout) || time.Since(start) > 4*time.Second {
		t.Fatalf("failed by the clock, not the bound: %v after %v", err, time.Since(start))
	}
	select {
	case total := <-sent:
		// the client stopped reading at the bound (1 MiB), plus what the sockets' buffers
		// hold on both sides
		if total > 32<<20 {
			t.Fatalf("the server wrote %d MiB before the client dropped it", total>>20)
		}
		t.Logf("the server wrote %.1f MiB before the drop: %v", float64(total)/(1<<20), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the client never dropped the endless reply")
	}
}

// hostileShard is a fake Redis on loopback that answers each connection with serve once the
// client's first write has come (buf: a 4 KiB buffer it read that write into), and a
// limiter on the host transport whose one shard it is, with the policy "strict" (a fixed
// window, on_error: error) and the config's timeout timeoutMS. Both close when t ends
// (the limiter first).
func hostileShard(t *testing.T, timeoutMS int, serve func(c net.Conn, buf []byte)) *Limiter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				serve(c, buf)
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	cfg := fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":%d,"policies":{
		"strict":{"algorithm":"fixed_window","limit":10,"window":"1h","on_error":"error"}}}`, port, timeoutMS)
	l, err := NewFromJSON(cfg, WithTransport(TransportHost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A lone check on an idle connection to a server that never answers fails by the config's
// deadline: the deadline timer is set when its bytes are handed out to be written (a check
// only queued has no deadline yet), not only while other checks keep it running.
func TestHostLoneCheckToASilentServerTimesOut(t *testing.T) {
	l := hostileShard(t, 200, func(c net.Conn, buf []byte) {
		for { // reads, never answers
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	ht := l.host.Load()
	waitFor(t, "connected", func() bool {
		ht.mu.Lock()
		defer ht.mu.Unlock()
		return ht.shards[0].conn != nil
	})
	// the connect's deadline has passed: nothing keeps the timer set
	waitFor(t, "the timer idle", func() bool {
		ht.mu.Lock()
		defer ht.mu.Unlock()
		return !ht.armed
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := l.Check(ctx, "k", "strict", 1)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("a check to a silent server: %v after %v, not the config's deadline (200 ms)", err, time.Since(start))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the deadline took %v", took)
	}
}
