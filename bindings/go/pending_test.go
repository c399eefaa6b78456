package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stop freezes redis-server (SIGSTOP): connections stay open, nothing answers. It is
// resumed when the test ends, before it is killed.
func (s *redisServer) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
}

// stalledLimiterWith is a limiter of `policies` (a JSON object) connected to a
// redis-server that is then stopped, with a deadline (10 s) far beyond the test's own
// bounds: only ctx can end its calls. warm runs first, while Redis answers (connections
// made, scripts loaded), and fails the test with what it returns.
func stalledLimiterWith(t *testing.T, policies string, warm func(ctx context.Context, l *Limiter) error) *Limiter {
	t.Helper()
	r := startRedis(t)
	l, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":10000,
		"policies":%s}`, r.Port, policies))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := warm(context.Background(), l); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	r.stop(t)
	return l
}

// stalledLimiter is stalledLimiterWith one policy, "api", warmed by a check.
func stalledLimiter(t *testing.T) *Limiter {
	t.Helper()
	return stalledLimiterWith(t, `{"api":{"algorithm":"fixed_window","limit":1000000,"window":"1h","on_error":"error"}}`,
		func(ctx context.Context, l *Limiter) error {
			if d, err := l.Check(ctx, "warm", "api", 1); err != nil || !d.Allowed {
				return fmt.Errorf("check: %+v %v", d, err)
			}
			return nil
		})
}

// cancelEachMidCall runs each call on l, cancels its ctx once it is in flight (the
// goroutine is about to park) and requires context.Canceled within 5 s.
func cancelEachMidCall(t *testing.T, l *Limiter, calls map[string]func(ctx context.Context) error) {
	t.Helper()
	for name, call := range calls {
		started := make(chan struct{}, 1)
		l.afterStart = func() { started <- struct{}{} }
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- call(ctx) }()
		<-started
		cancel()
		select {
		case err := <-res:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: err %v, want context.Canceled", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: cancel was ignored", name)
		}
		l.afterStart = nil
	}
}

// A 5 ms deadline against a stopped Redis returns context.DeadlineExceeded at about 5 ms,
// not ErrTimeout after the config's deadline.
func TestDeadlineAgainstStoppedRedis(t *testing.T) {
	l := stalledLimiter(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := l.Check(ctx, "k", "api", 1)
	elapsed := time.Since(t0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want context.DeadlineExceeded", err)
	}
	// the config's deadline is 10 s: anything near it means ctx was ignored
	if elapsed > 2*time.Second {
		t.Fatalf("returned after %v", elapsed)
	}
	t.Logf("5 ms deadline: returned after %v", elapsed)
}

// Cancelling mid-call (once the call is in flight) returns context.Canceled, for each
// kind of call that waits for Redis.
func TestCancelMidCall(t *testing.T) {
	l := stalledLimiter(t)
	cancelEachMidCall(t, l, map[string]func(ctx context.Context) error{
		"Check":    func(ctx context.Context) error { _, err := l.Check(ctx, "k", "api", 1); return err },
		"Peek":     func(ctx context.Context) error { _, err := l.Peek(ctx, "k", "api"); return err },
		"Reset":    func(ctx context.Context) error { return l.Reset(ctx, "k", "api") },
		"CheckAll": func(ctx context.Context) error { _, err := l.CheckAll(ctx, []Layer{{"k", "api", 1}}); return err },
		"Block":    func(ctx context.Context) error { return l.Block(ctx, "k", time.Minute, "test") },
		"Unblock":  func(ctx context.Context) error { _, err := l.Unblock(ctx, "k"); return err },
		"Blocked":  func(ctx context.Context) error { _, err := l.Blocked(ctx, "k"); return err },
	})
}

func osThreads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}

// inFlight starts n calls (call(ctx, i) for i in 0..n) on a stalled limiter and returns
// once all are in flight, with the function that cancels them and checks that each
// returned context.Canceled.
func inFlight(t *testing.T, l *Limiter, n int, call func(ctx context.Context, i int) error) func() {
	var started sync.WaitGroup
	started.Add(n)
	l.afterStart = started.Done
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- call(ctx, i) }()
	}
	started.Wait()
	return func() {
		cancel()
		for i := 0; i < n; i++ {
			if err := <-errs; !errors.Is(err, context.Canceled) {
				t.Fatalf("call %d: %v, want context.Canceled", i, err)
			}
		}
		l.afterStart = nil
	}
}

// checks is inFlight's call for a stalledLimiter: a check of its own key each.
func checks(l *Limiter) func(ctx context.Context, i int) error {
	return func(ctx context.Context, i int) error {
		_, err := l.Check(ctx, fmt.Sprintf("user:%d", i), "api", 1)
		return err
	}
}

// fewThreads fails unless the OS threads counted with n calls in flight (`during`) stay
// within GOMAXPROCS plus a small constant: the library's own threads, and the few that Go
// adds when a start call is descheduled on a loaded machine (a thread per call: n more).
func fewThreads(t *testing.T, before, during, n int) {
	t.Helper()
	procs := runtime.GOMAXPROCS(0)
	t.Logf("OS threads: %d before, %d with %d calls in flight (GOMAXPROCS %d)", before, during, n, procs)
	if during > procs+64 {
		t.Fatalf("%d OS threads with %d calls in flight (%d before, GOMAXPROCS %d)", during, n, before, procs)
	}
}

// 1000 goroutines waiting on a stopped Redis hold no OS thread each (fewThreads). One
// thread per call was 1006.
func TestNoThreadPerCallInFlight(t *testing.T) {
	l := stalledLimiter(t)
	before := osThreads(t)
	finish := inFlight(t, l, 1000, checks(l))
	during := osThreads(t)
	finish()
	fewThreads(t, before, during, 1000)
}

// With debug.SetMaxThreads(100), 400 calls in flight on a stopped Redis do not kill the
// process (one thread per call did: "fatal error: thread exhaustion"). In a child process,
// since exhaustion is fatal.
func TestMaxThreadsSurvivesCallsInFlight(t *testing.T) {
	if os.Getenv("SHARDLIMIT_MAX_THREADS_CHILD") == "1" {
		l := stalledLimiter(t)
		debug.SetMaxThreads(100)
		inFlight(t, l, 400, checks(l))()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestMaxThreadsSurvivesCallsInFlight$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SHARDLIMIT_MAX_THREADS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
