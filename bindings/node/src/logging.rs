//! The core's rate-limited warning lines (`Limiter::set_log_sink`) to JS: a weak
//! threadsafe function, so the line is handed to the JS thread (never a call into JS
//! from the I/O thread) and never keeps the process alive. `index.js` turns the record
//! into `console.warn` or the `logger` option.

use super::*;
use shardlimit::LogRecord;

fn record_json(r: &LogRecord) -> serde_json::Value {
    serde_json::json!({
        "level": r.level.name(),
        "target": r.target,
        "reason": r.reason.name(),
        "subject": r.subject,
        "errorKind": r.error_kind.name(),
        "error": r.error,
        "allowed": r.allowed,
        "suppressed": r.suppressed,
        "message": r.message,
    })
}

#[napi]
impl NativeLimiter {
    /// Calls `callback(record)` on the JS thread for each warning line of the core (at
    /// most 1024 queued while JS is busy; more are dropped); null removes it.
    #[napi(catch_unwind)]
    pub fn set_log_sink(
        &self,
        callback: Option<Function<'_, serde_json::Value, Unknown<'static>>>,
    ) -> Result<()> {
        let Some(callback) = callback else {
            self.inner.set_log_sink(None);
            return Ok(());
        };
        let tsfn = callback
            .build_threadsafe_function::<serde_json::Value>()
            .weak::<true>()
            .max_queue_size::<1024>()
            .build_callback(|ctx| Ok(ctx.value))?;
        self.inner.set_log_sink(Some(Arc::new(move |r: &LogRecord| {
            tsfn.call(record_json(r), ThreadsafeFunctionCallMode::NonBlocking);
        })));
        Ok(())
    }
}
