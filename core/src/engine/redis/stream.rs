//! Events: to subscribers, and to the Redis event stream of each shard.

use super::*;

pub(crate) type StreamItem = (usize, Vec<(&'static str, String)>);

/// Events queued for the Redis stream writer before new ones are dropped.
pub(super) const STREAM_QUEUE: usize = 4096;

/// The event stream expires this long after its last event (7 days).
pub(super) const EVENTS_STREAM_TTL_MS: u64 = 7 * 86_400_000;

impl RedisEngine {
    pub(super) fn emit(&self, e: Event) {
        if self.subscribers.active() {
            self.subscribers.emit(&e);
        }
    }

    /// Queues an event for the Redis stream of `shard` (when configured); never waits.
    pub fn stream(self: &Arc<Self>, shard: usize, e: &Event) {
        if self.stream_maxlen.is_none() {
            return;
        }
        let Ok(st) = self.state() else { return };
        if let Some(tx) = &st.stream_tx {
            if tx.try_send((shard, e.fields())).is_err() {
                self.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(super) async fn stream_writer(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::Receiver<StreamItem>,
        maxlen: u64,
    ) {
        let key = events_key(&self.prefix);
        while let Some((shard, fields)) = rx.recv().await {
            if self.circuit_open(shard) {
                self.events_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Ok(st) = self.state() else { return };
            let at = self.at(&key);
            let key = key.clone();
            let r = self
                .raw(&st, shard, at.as_deref(), |mut conn| async move {
                    let mut cmd = redis::cmd("XADD");
                    cmd.arg(&key).arg("MAXLEN").arg("~").arg(maxlen).arg("*");
                    for (k, v) in fields {
                        cmd.arg(k).arg(v);
                    }
                    cmd.query_async::<String>(&mut conn).await?;
                    // trimmed by length above, and gone a while after the last event, so a
                    // stream that is turned off does not stay forever
                    redis::cmd("PEXPIRE")
                        .arg(&key)
                        .arg(EVENTS_STREAM_TTL_MS)
                        .query_async::<i64>(&mut conn)
                        .await
                        .map(|_| String::new())
                })
                .await;
            if r.is_err() {
                self.events_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
