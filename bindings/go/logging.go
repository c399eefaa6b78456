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
// They are read from a log subscription of the C ABI by one goroutine per limiter (it
// holds an OS thread while it waits in the library, as Subscribe's does), never by a
// callback into Go from a library thread. It ends when the limiter is closed.

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
		if err != nil || (o.log.set && o.log.logger == nil) {
			return l, err
		}
		var sub *C.shardlimit_log_subscription
		var e *C.shardlimit_error
		if rc := C.shardlimit_subscribe_logs(l.h.Load().p, 0, &sub, &e); rc != C.SHARDLIMIT_OK {
			l.Close()
			return nil, takeError(rc, e)
		}
		go forwardLogs(sub, o.log.logger)
		return l, nil
	}
}

func forwardLogs(sub *C.shardlimit_log_subscription, logger *slog.Logger) {
	defer C.shardlimit_log_subscription_free(sub)
	var line C.shardlimit_log_line
	for {
		var got C.bool
		if rc := C.shardlimit_log_subscription_next(sub, C.UINT64_MAX, &got, &line, nil); rc != C.SHARDLIMIT_OK {
			return // CLOSED: the limiter is gone
		}
		if !got {
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
