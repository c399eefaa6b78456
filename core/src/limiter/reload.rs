//! Reloading the config: swap the view atomically, keep what did not change.

use super::metrics::{config_series, Series};
use super::{Engine, Handoff, Limiter, View};
use crate::config::{Config, ReloadReport};
use crate::error::Result;
use crate::time::clock::{Clock, MonotonicClock};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Stops watching a config file when dropped.
#[derive(Debug)]
pub struct ConfigWatcher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ConfigWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Limiter {
    /// Swaps in a new, already validated config atomically: checks in flight finish on the
    /// old shards and policies, new checks use the new ones, none fails. Connections are
    /// kept when the shard list is unchanged. When it changed, keys whose shard changed
    /// carry their state over from the old shard on their first check during
    /// `reshard_handoff` (default 10 minutes), so a client at its limit stays limited.
    pub fn reload(&self, config: Config) -> Result<ReloadReport> {
        let old = self.view();
        let same_backend = old.config.shards == config.shards
            && old.config.cluster == config.cluster
            && old.config.cluster_tls == config.cluster_tls
            && old.config.key_prefix == config.key_prefix
            && old.config.timeout == config.timeout
            && old.config.events_stream_maxlen == config.events_stream_maxlen;
        let engine = if same_backend {
            match &old.engine {
                Engine::Memory(m) => Engine::Memory(m.clone()),
                Engine::Redis(r) => {
                    // the connections stay; the spinning follows the new config
                    r.set_spin_wait(config.spin_wait);
                    r.set_max_queue(config.max_queue);
                    Engine::Redis(r.clone())
                }
            }
        } else {
            Limiter::build_engine(&config, self.inner.subscribers.clone())?
        };
        let handoff = match (&old.engine, &engine) {
            (Engine::Redis(o), Engine::Redis(n)) if !Arc::ptr_eq(o, n) => {
                let moved = o
                    .shards
                    .iter()
                    .map(|s| &s.url)
                    .ne(n.shards.iter().map(|s| &s.url));
                moved.then(|| Handoff {
                    old: o.clone(),
                    until: MonotonicClock.now_us()
                        + config.effective_reshard_handoff().as_micros() as u64,
                    done: Mutex::new(Default::default()),
                })
            }
            // a reload that keeps the backend keeps an ongoing handoff
            _ if same_backend => old.handoff.as_ref().map(|h| Handoff {
                old: h.old.clone(),
                until: h.until,
                done: Mutex::new(h.done.lock().clone()),
            }),
            _ => None,
        };
        let names = |c: &Config| {
            c.policies
                .keys()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
        };
        let (before, after) = (names(&old.config), names(&config));
        let report = ReloadReport {
            engine_changed: !same_backend,
            handoff: handoff.is_some(),
            policies_added: after.difference(&before).cloned().collect(),
            policies_removed: before.difference(&after).cloned().collect(),
            policies_changed: after
                .intersection(&before)
                .filter(|n| {
                    let (a, b) = (&old.config.policies[*n], &config.policies[*n]);
                    a.limits() != b.limits()
                        || a.on_error() != b.on_error()
                        || a.auto_block() != b.auto_block()
                        || a.local_admission() != b.local_admission()
                })
                .cloned()
                .collect(),
        };
        // the counters stay: of policies kept, by name; of policies removed, as ad-hoc
        // series (a caller may still hold one); an ad-hoc series whose name the config now
        // has becomes the policy's
        // (held until the view is stored: a series added meanwhile would be one the view
        // does not have, and policies keep the series they resolve, limiter/metrics.rs)
        let adding = self.inner.adhoc_add.lock();
        let series = {
            let adhoc = self.inner.adhoc.load_full();
            let series = config_series(&config, Some(&old.series), &adhoc);
            let mut next: Series = adhoc
                .iter()
                .filter(|(n, _)| !series.contains_key(&***n))
                .map(|(n, c)| (n.clone(), c.clone()))
                .collect();
            for (n, c) in old.series.iter() {
                if !series.contains_key(&**n) {
                    next.insert(n.clone(), c.clone());
                }
            }
            self.inner.adhoc.store(Arc::new(next));
            series
        };
        self.inner.subscribers.log.set_interval(config.log_interval);
        let fast = super::fast_flags(self.inner.memory.as_ref(), &engine, &config);
        self.inner.view.store(Arc::new(View {
            series,
            config: Arc::new(config),
            engine,
            handoff,
        }));
        // (after the view: a check reading the new flags finds the new view's engine)
        self.inner.fast.store(fast, Ordering::Release);
        self.inner.generation.fetch_add(1, Ordering::Release);
        drop(adding);
        tracing::info!(?report, "shardlimit: config reloaded");
        if self.inner.subscribers.active() {
            self.inner
                .subscribers
                .emit(&crate::events::Event::Reloaded {
                    report: report.clone(),
                });
        }
        Ok(report)
    }

    /// Reads, validates and applies a config file. A bad file is rejected with the reason
    /// and the old config stays in force.
    pub fn reload_from_file(&self, path: impl AsRef<std::path::Path>) -> Result<ReloadReport> {
        self.reload(Config::from_file(path)?)
    }

    /// Watches `path` (polling its modification time every `every`) and reloads when it
    /// changes; a bad new config is logged and ignored. Stops when the returned watcher is
    /// dropped, or when every clone of this limiter is gone.
    pub fn watch_config(
        &self,
        path: impl Into<std::path::PathBuf>,
        every: Duration,
    ) -> ConfigWatcher {
        let path = path.into();
        let weak = Arc::downgrade(&self.inner);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut last = mtime(&path);
        let handle = std::thread::Builder::new()
            .name("shardlimit-config-watch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    let Some(inner) = weak.upgrade() else { return };
                    let now = mtime(&path);
                    if now != last {
                        last = now;
                        let limiter = Limiter { inner };
                        match limiter.reload_from_file(&path) {
                            Ok(_) => {}
                            Err(e) => {
                                limiter.inner.subscribers.log.note(
                                    limiter.now(),
                                    crate::log::LogReason::ConfigRejected,
                                    &path.display().to_string(),
                                    &e,
                                    None,
                                );
                                if limiter.inner.subscribers.active() {
                                    limiter.inner.subscribers.emit(
                                        &crate::events::Event::ReloadRejected {
                                            path: path.display().to_string(),
                                            error: e,
                                        },
                                    );
                                }
                            }
                        }
                    }
                }
            })
            .ok();
        ConfigWatcher { stop, handle }
    }
}
