//! Reload events: every applied reload is told to subscribers (`Event::Reloaded`, with what
//! changed), and a watched file whose new config is rejected too (`Event::ReloadRejected`),
//! so a caller can wait for a reload instead of sleeping and hoping.

mod support;

use shardlimit::{Event, Limiter};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use support::RedisServer;

fn policies(limit: u64) -> String {
    format!(
        r#""policies": {{"api": {{"algorithm": "fixed_window", "limit": {limit}, "window": "1h"}}}}"#
    )
}

fn events(limiter: &Limiter) -> mpsc::Receiver<Vec<(&'static str, String)>> {
    let (tx, rx) = mpsc::sync_channel(64);
    limiter.subscribe(Arc::new(move |e: &Event| {
        if matches!(e, Event::Reloaded { .. } | Event::ReloadRejected { .. }) {
            let _ = tx.try_send(e.fields());
        }
    }));
    rx
}

/// Replaces `path` with `text` at a modification time of its own, so the watcher sees a
/// change whatever the file system's time resolution, and sees it once, whole: the file
/// is written and dated aside, then renamed over `path`.
fn write_at(path: &std::path::Path, text: &str, secs: u64) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    let f = std::fs::File::options().write(true).open(&tmp).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
    drop(f);
    std::fs::rename(&tmp, path).unwrap();
}

fn field<'a>(fields: &'a [(&'static str, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

fn watched_reload_is_an_event(shards: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlimit.json");
    write_at(&path, &format!("{{{shards}{}}}", policies(2)), 1_000_000);
    let limiter = Limiter::from_config_file(&path).unwrap();
    let rx = events(&limiter);
    let _watch = limiter.watch_config(&path, Duration::from_millis(5));
    assert_eq!(
        limiter.check_by_name_blocking("k", "api", 1).unwrap().limit,
        2
    );

    write_at(&path, &format!("{{{shards}{}}}", policies(7)), 2_000_000);
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("no reload event");
    assert_eq!(field(&e, "kind"), "reloaded");
    assert_eq!(field(&e, "policies_changed"), "api");
    assert_eq!(field(&e, "engine_changed"), "false");
    // the event comes after the swap: the next check has the new limit
    assert_eq!(
        limiter.check_by_name_blocking("k", "api", 1).unwrap().limit,
        7
    );

    write_at(&path, "{ not json", 3_000_000);
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("no rejection event");
    assert_eq!(field(&e, "kind"), "reload_rejected");
    assert_eq!(field(&e, "path"), path.display().to_string());
    assert!(!field(&e, "error").is_empty());
    assert_eq!(
        limiter.check_by_name_blocking("k", "api", 1).unwrap().limit,
        7
    );
}

#[test]
fn watched_reload_is_an_event_in_memory() {
    watched_reload_is_an_event("");
}

#[test]
fn watched_reload_is_an_event_on_redis() {
    let s = RedisServer::start();
    watched_reload_is_an_event(&format!(
        r#""shards": [{{"name": "s0", "url": "{}"}}], "#,
        s.url()
    ));
}

#[test]
fn explicit_reload_is_an_event_and_a_rejected_one_is_not() {
    let limiter = Limiter::from_json(&format!("{{{}}}", policies(2))).unwrap();
    let rx = events(&limiter);
    let next = shardlimit::Config::from_json(&format!("{{{}}}", policies(3))).unwrap();
    limiter.reload(next).unwrap();
    let e = rx.try_recv().expect("the reload was not told");
    assert_eq!(field(&e, "kind"), "reloaded");
    assert_eq!(field(&e, "policies_changed"), "api");
    // a reload refused before it is applied returns its error to the caller only
    assert!(limiter
        .reload_from_file("/nonexistent/shardlimit.json")
        .is_err());
    assert!(rx.try_recv().is_err());
}

/// An in-memory check reads the engine and whether the config names policies without
/// the view: a reload that names a policy must refuse an ad-hoc policy of that name from
/// the next check on, and one that drops it allow it again, on the same state.
#[test]
fn an_in_memory_reload_is_seen_by_the_next_check() {
    use shardlimit::{Config, Limit, Policy};
    let limiter = Limiter::memory();
    let login = Policy::new("login", Limit::fixed_window(10, Duration::from_secs(3600))).unwrap();
    assert_eq!(limiter.check_blocking("k", &login, 1).unwrap().remaining, 9);
    limiter
        .reload(Config::from_json(&format!("{{{}}}", policies(5).replace("api", "login"))).unwrap())
        .unwrap();
    let e = limiter.check_blocking("k", &login, 1).unwrap_err();
    assert!(e.to_string().contains("configured policy"), "{e}");
    limiter.reload(Config::from_json("{}").unwrap()).unwrap();
    // (the engine and its state were kept across both reloads)
    assert_eq!(limiter.check_blocking("k", &login, 1).unwrap().remaining, 8);
}
