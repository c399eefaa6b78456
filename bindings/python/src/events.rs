//! The event stream and the warning lines, for Python callbacks.

use super::*;

#[pymethods]
impl Limiter {
    /// Calls `callback(event)` for every event (denials, blocks, fallbacks, circuit
    /// changes); `event` is a dict of strings with at least `"kind"` (the kind) and the
    /// kind's fields (`policy`, `key`, `limit`, `retry_after_ms`, `error`, `allowed`,
    /// `shard`, `state`). Callbacks run on one thread per subscription, never on the I/O
    /// thread; at most 1024 events wait for a slow callback, later ones are dropped.
    /// An exception in the callback is reported as unraisable and the next event delivered.
    /// Not inherited by a forked child: subscribe again there. Once the interpreter exits
    /// (its `atexit` hooks), no callback is called again.
    fn subscribe(&self, callback: Py<PyAny>) -> PyResult<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(&'static str, String)>>(1024);
        delivery::spawn("shardlimit-events", rx, move |py, fields| {
            let call = || -> PyResult<()> {
                let d = PyDict::new(py);
                for (k, v) in fields {
                    d.set_item(k, v)?;
                }
                callback.call1(py, (d,))?;
                Ok(())
            };
            if let Err(e) = call() {
                e.write_unraisable(py, Some(callback.bind(py)));
            }
        })?;
        self.inner()?
            .subscribe(Arc::new(move |e: &shardlimit::Event| {
                let _ = tx.try_send(e.fields());
            }));
        Ok(())
    }
    /// Where the limiter's warning lines go (every fallback to `on_error`, a circuit
    /// opened, a failed handoff or refund, a rejected watched config; at most one per
    /// reason and policy or shard per the config's `log_interval`, each with how many
    /// were suppressed since the last). By default they are logged to
    /// `logging.getLogger("shardlimit")` at WARNING (ERROR for a rejected config), with
    /// the record's fields in `extra={"shardlimit": {...}}`. `callback(record)` receives
    /// them instead, as a dict (`level`, `target`, `reason`, `subject`, `error_kind`,
    /// `error`, `allowed`, `suppressed`, `message`); None drops them. Called on a thread
    /// of shardlimit's own (never the I/O thread), at most 1024 lines queued.
    fn set_log_sink(&self, callback: Option<Py<PyAny>>) -> PyResult<()> {
        logging::set_sink(&self.inner()?, callback);
        Ok(())
    }
}
