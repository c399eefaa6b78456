//! The event stream, as plain JS objects with camelCase fields.

use super::*;

pub(crate) fn camel(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut up = false;
    for c in field.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// An event as a plain object: `kind` plus its fields (strings, as in the events stream),
/// in camelCase.
pub(crate) fn event_json(e: &shardlimit::Event) -> serde_json::Value {
    let mut obj = serde_json::Map::new();
    obj.insert("kind".into(), e.kind().into());
    for (k, v) in e.fields() {
        if k != "kind" {
            obj.insert(camel(k), v.into());
        }
    }
    serde_json::Value::Object(obj)
}

#[napi]
impl NativeLimiter {
    /// Calls `callback(event)` on this thread for every event of the core (denials,
    /// blocks, fallbacks, circuit changes). Events are queued (at most 1024; more are
    /// dropped while JS is busy) and never keep the process alive.
    #[napi(catch_unwind)]
    pub fn subscribe(
        &self,
        callback: Function<'_, serde_json::Value, Unknown<'static>>,
    ) -> Result<()> {
        let tsfn = callback
            .build_threadsafe_function::<serde_json::Value>()
            .weak::<true>()
            .max_queue_size::<1024>()
            .build_callback(|ctx| Ok(ctx.value))?;
        self.inner.subscribe(Arc::new(move |e: &shardlimit::Event| {
            tsfn.call(event_json(e), ThreadsafeFunctionCallMode::NonBlocking);
        }));
        Ok(())
    }
}
