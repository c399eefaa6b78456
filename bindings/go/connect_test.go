package shardlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// info reads one field of INFO from redis-server on port (a raw RESP exchange).
func info(t *testing.T, port int, section, field string) string {
	t.Helper()
	c, r, err := rawRedis(port, 2*time.Second, fmt.Sprintf("INFO %s\r\n", section))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		t.Fatalf("INFO: %q %v", head, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n < 0 || n > 1<<20 {
		t.Fatalf("INFO length %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return ""
}

// Connect makes the connections and loads the scripts before any call, within its own
// timeout; a shard that does not answer is a timeout error naming that timeout.
func TestConnect(t *testing.T) {
	ctx := context.Background()
	m, err := NewMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Connect(ctx, time.Second); err != nil {
		t.Fatalf("memory: %v", err)
	}
	r := startRedis(t)
	l, err := NewFromJSON(r.config(`"api":{"algorithm":"fixed_window","limit":5,"window":"1m"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := info(t, r.Port, "memory", "number_of_cached_scripts"); got != "0" {
		t.Fatalf("scripts before connect: %s", got)
	}
	if err := l.Connect(ctx, 2*time.Second); err != nil {
		t.Fatalf("connect: %v", err)
	}
	if got := info(t, r.Port, "memory", "number_of_cached_scripts"); got == "0" {
		t.Fatal("connect loaded no script")
	}
	if err := l.Connect(ctx, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("zero timeout: %v", err)
	}

	frozen := startRedis(t)
	frozen.stop(t)
	f, err := NewFromJSON(fmt.Sprintf(`{"shards":[{"name":"s0","url":"redis://127.0.0.1:%d"}],"timeout_ms":50,"policies":{}}`, frozen.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t0 := time.Now()
	err = f.Connect(ctx, 300*time.Millisecond)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "300 ms") {
		t.Fatalf("frozen shard: %v", err)
	}
	if e := time.Since(t0); e > 3*time.Second {
		t.Fatalf("connect took %v", e)
	}
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	if err := f.Connect(short, 10*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ctx deadline: %v", err)
	}
}
