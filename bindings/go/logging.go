package shardlimit

/*
#include <stdint.h>
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"log/slog"
)

// The library's warning lines (a fallback to on_error, a circuit opened, a failed
// reshard handoff or refund, a rejected watched config), at most one per reason and
// policy (or shard) per the config's log_interval (10s by default), go to log/slog: to
// slog.Default() as it is when the line is written, or to the logger of WithLogger.
// They are read from a log subscription of the C ABI by one goroutine per limiter, never
// by a callback into Go from a library thread; it holds no OS thread while it waits (the
// subscription wakes it through the completion queue of started calls) and ends when
// the limiter is closed. The C ABI's own default (lines to stderr) is turned off.

type logOption struct {
	set    bool
	logger *slog.Logger
}

// WithLogger sends the limiter's warning lines to logger instead of slog.Default();
// WithLogger(nil) drops them. Each line is a slog record at LevelWarn (LevelError for a
// rejected config) whose message is the whole line, with the attributes reason
// ("fallback", "circuit_opened", "handoff_failed", "config_rejected", "refund_failed"),
// subject (the policy, shard or file), error_code, suppressed (how many lines of this
// reason and subject were not written since the last one) and, for a fallback, allowed.
func WithLogger(logger *slog.Logger) Option {
	return func(o *options) { o.log = logOption{set: true, logger: logger} }
}

// logTo starts the warning lines' goroutine of a limiter just made with opts.
func logTo(opts []Option) func(*Limiter, error) (*Limiter, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return func(l *Limiter, err error) (*Limiter, error) {
		if err != nil {
			return l, err
		}
		h := l.h.Load().p
		var e *C.shardlimit_error
		// the lines go to slog (or nowhere), not to the C ABI's default, stderr
		if rc := C.shardlimit_set_log_callback(h, nil, nil, &e); rc != C.SHARDLIMIT_OK {
			l.Close()
			return nil, takeError(rc, e)
		}
		if o.log.set && o.log.logger == nil {
			return l, nil
		}
		if err := startDispatch(); err != nil {
			l.Close()
			return nil, err
		}
		var sub *C.shardlimit_log_subscription
		if rc := C.shardlimit_subscribe_logs(h, 0, &sub, &e); rc != C.SHARDLIMIT_OK {
			l.Close()
			return nil, takeError(rc, e)
		}
		user, id, wake := newWaker()
		if rc := C.shardlimit_log_subscription_set_notify(sub, goNotify, user, &e); rc != C.SHARDLIMIT_OK {
			C.shardlimit_log_subscription_free(sub)
			wakers.Delete(id)
			l.Close()
			return nil, takeError(rc, e)
		}
		go forwardLogs(sub, id, wake, o.log.logger)
		return l, nil
	}
}

// forwardLogs drains the log subscription whenever it notifies (it went from empty to
// holding a line, or closed), until it closes with the limiter.
func forwardLogs(sub *C.shardlimit_log_subscription, id uintptr, wake chan struct{}, logger *slog.Logger) {
	defer wakers.Delete(id)
	defer C.shardlimit_log_subscription_free(sub)
	var line C.shardlimit_log_line
	for {
		var got C.bool
		if rc := C.shardlimit_log_subscription_next(sub, 0, &got, &line, nil); rc != C.SHARDLIMIT_OK {
			return // CLOSED: the limiter is gone
		}
		if !got {
			<-wake
			continue
		}
		lg := logger
		if lg == nil {
			lg = slog.Default()
		}
		level := slog.LevelWarn
		if line.level == C.SHARDLIMIT_LOG_ERROR {
			level = slog.LevelError
		}
		attrs := []slog.Attr{
			slog.String("reason", C.GoString(&line.reason[0])),
			slog.String("subject", C.GoStringN(&line.subject[0], C.int(line.subject_len))),
			slog.String("error_code", Code(line.error_code).String()),
			slog.Uint64("suppressed", uint64(line.suppressed)),
		}
		if line.has_allowed {
			attrs = append(attrs, slog.Bool("allowed", bool(line.allowed)))
		}
		msg := C.GoStringN(&line.message[0], C.int(line.message_len))
		lg.LogAttrs(context.Background(), level, msg, attrs...)
	}
}
