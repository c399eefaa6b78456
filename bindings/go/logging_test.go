package shardlimit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// captureHandler hands every record to a channel.
type captureHandler struct{ ch chan slog.Record }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.ch <- r.Clone()
	return nil
}
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h captureHandler) WithGroup(string) slog.Handler      { return h }

func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

// lines keeps every record read so far, so that waiting for one kind skips no other.
type lines struct {
	ch   chan slog.Record
	seen []slog.Record
}

// next waits (bounded) for the next record of reason and subject not taken yet.
func (l *lines) next(t *testing.T, reason, subject string) slog.Record {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for i, r := range l.seen {
			a := attrs(r)
			if a["reason"] == reason && a["subject"] == subject {
				l.seen = append(l.seen[:i:i], l.seen[i+1:]...)
				return r
			}
		}
		select {
		case r := <-l.ch:
			l.seen = append(l.seen, r)
		case <-deadline:
			t.Fatalf("no %s line for %s within 10s", reason, subject)
		}
	}
}

func deadConfig(t *testing.T) string {
	// nothing listens on the port: every check falls back to on_error
	return fmt.Sprintf(`{"timeout_ms": 300,
		"shards": [{"name": "dead", "url": "redis://127.0.0.1:%d"}],
		"policies": {"api": {"rate": "10/minute", "on_error": "open"}}}`, freePort(t))
}

func TestFallbacksAreOneSlogLinePerIntervalWithTheSuppressedCount(t *testing.T) {
	clock, err := NewManualClock(time.Unix(1_700_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer clock.Close()
	ch := make(chan slog.Record, 64)
	l, err := NewFromJSON(deadConfig(t), WithClock(clock), WithLogger(slog.New(captureHandler{ch})))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		d, err := l.Check(ctx, "k", "api", 1)
		if err != nil || !d.Allowed {
			t.Fatalf("check %d: %v %+v", i, err, d)
		}
	}
	got := &lines{ch: ch}
	first := got.next(t, "fallback", "api")
	a := attrs(first)
	if first.Level != slog.LevelWarn || a["suppressed"] != "0" || a["allowed"] != "true" {
		t.Fatalf("first line: %v %v", first.Level, a)
	}
	if !strings.Contains(first.Message, "policy `api` fell back to on_error and allowed") {
		t.Fatalf("message: %q", first.Message)
	}
	if c := a["error_code"]; c != "connection" && c != "unavailable" && c != "timeout" {
		t.Fatalf("error_code %q", c)
	}
	// the interval later on the limiter's clock: the next line says 999 were not written,
	// so no other fallback line came between the two
	if err := clock.Advance(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Check(ctx, "k", "api", 1); err != nil {
		t.Fatal(err)
	}
	second := got.next(t, "fallback", "api")
	if got := attrs(second)["suppressed"]; got != "999" {
		t.Fatalf("second line suppressed %s: %q", got, second.Message)
	}
	if !strings.Contains(second.Message, "(999 more since the last line") {
		t.Fatalf("message: %q", second.Message)
	}
	got.next(t, "circuit_opened", "dead")
}

func TestWarningLinesGoToSlogDefaultUnlessALoggerIsGiven(t *testing.T) {
	ch := make(chan slog.Record, 64)
	old := slog.Default()
	slog.SetDefault(slog.New(captureHandler{ch}))
	defer slog.SetDefault(old)
	l, err := NewFromJSON(deadConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Check(context.Background(), "k", "api", 1); err != nil {
		t.Fatal(err)
	}
	r := (&lines{ch: ch}).next(t, "fallback", "api")
	if !strings.Contains(r.Message, "fell back") {
		t.Fatalf("%q", r.Message)
	}
}
