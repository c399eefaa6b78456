//! `Limiter::config_generation`: how many reloads are in force, so that a host deriving
//! something from the config (the Go middleware: which of its rules are concurrency
//! limits) knows per request, with one atomic load, when to derive it again.

use shardlimit::{Config, Event, Limiter};
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

fn config(algorithm: &str) -> String {
    match algorithm {
        "concurrency" => {
            r#"{"policies": {"api": {"algorithm": "concurrency", "max": 2, "lease_ttl": "30s"}}}"#
                .into()
        }
        _ => r#"{"policies": {"api": {"algorithm": "fixed_window", "limit": 5, "window": "1h"}}}"#
            .into(),
    }
}

#[test]
fn every_applied_reload_adds_one_and_a_refused_one_none() {
    let l = Limiter::from_json(&config("fixed_window")).unwrap();
    assert_eq!(l.config_generation(), 0);
    l.reload(Config::from_json(&config("concurrency")).unwrap())
        .unwrap();
    assert_eq!(l.config_generation(), 1);
    // the generation that says "changed" comes with the new config in force
    assert_eq!(
        l.policy("api").unwrap().algorithm(),
        shardlimit::Algorithm::Concurrency
    );
    assert!(l.reload_from_file("/nonexistent/shardlimit.json").is_err());
    assert_eq!(l.config_generation(), 1);
    // clones share it
    let c = l.clone();
    c.reload(Config::from_json(&config("fixed_window")).unwrap())
        .unwrap();
    assert_eq!(l.config_generation(), 2);
    // another limiter has its own
    assert_eq!(
        Limiter::from_json(&config("fixed_window"))
            .unwrap()
            .config_generation(),
        0
    );
}

#[test]
fn a_watched_reload_adds_one_before_its_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardlimit.json");
    std::fs::write(&path, config("fixed_window")).unwrap();
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
        .unwrap();
    drop(f);
    let l = Limiter::from_config_file(&path).unwrap();
    let (tx, rx) = mpsc::sync_channel(8);
    l.subscribe(Arc::new(move |e: &Event| {
        if matches!(e, Event::Reloaded { .. }) {
            let _ = tx.try_send(());
        }
    }));
    let _watch = l.watch_config(&path, Duration::from_millis(5));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, config("concurrency")).unwrap();
    let f = std::fs::File::options().write(true).open(&tmp).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000))
        .unwrap();
    drop(f);
    std::fs::rename(&tmp, &path).unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("no reload event");
    assert_eq!(l.config_generation(), 1);
}
