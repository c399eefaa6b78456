//! A layered check (`check_all`) never takes a concurrency policy's units: it would take
//! them under a lease id no caller holds, so the units would stay taken until the lease's
//! TTL (a concurrency route limit locked out after `max` requests). It is
//! an `invalid_argument` error naming the layer and the remedy, on both engines, on the
//! shadow and override paths too, and before anything is sent to Redis.

mod support;

use shardlimit::{Config, Error, ErrorKind, Layer, Limiter, ManualClock};
use support::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

const POLICIES: &str = r#"{
    "ip": {"algorithm": "fixed_window", "limit": 10, "window": "1m"},
    "watch": {"algorithm": "fixed_window", "limit": 10, "window": "1m", "shadow": true},
    "tenant": {"algorithm": "token_bucket", "capacity": 10, "refill_per_sec": 1, "overrides": true},
    "uploads": {"algorithm": "concurrency", "max": 2, "lease_ttl": "30s"},
    "jobs": {"algorithm": "concurrency", "max": 2, "lease_ttl": "30s", "overrides": true}}"#;

fn engines(server: &RedisServer) -> Vec<(&'static str, Limiter)> {
    let cfg = Config::from_json(&format!(r#"{{"policies": {POLICIES}}}"#)).unwrap();
    let memory = Limiter::new(cfg).unwrap();
    let redis = Limiter::from_json(&support::config(&[server], POLICIES)).unwrap();
    vec![("memory", memory), ("redis", redis)]
        .into_iter()
        .map(|(n, l)| (n, l.with_clock(ManualClock::new(T0)).unwrap()))
        .collect()
}

fn assert_rejected(
    engine: &str,
    r: shardlimit::Result<shardlimit::Decision>,
    what: &str,
    name: &str,
) {
    let e = match r {
        Err(e) => e,
        Ok(d) => panic!("{engine}: a concurrency layer was checked: {d:?}"),
    };
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{engine}: {e}");
    match &e {
        Error::InvalidArgument { what: w, message } => {
            assert_eq!(w, what, "{engine}: {e}");
            assert_eq!(
                message,
                &format!(
                    "policy \"{name}\" is a concurrency policy: acquire() it and release the lease"
                ),
                "{engine}"
            );
        }
        other => panic!("{engine}: {other:?}"),
    }
}

#[test]
fn a_concurrency_layer_is_an_error_and_nothing_is_taken() {
    let server = RedisServer::start();
    for (engine, l) in engines(&server) {
        let (ip, uploads) = (l.policy("ip").unwrap(), l.policy("uploads").unwrap());
        let layers = [Layer::new("u", &ip, 1), Layer::new("u", &uploads, 1)];
        // as many times as the limit allows leases, and more: each would have held a unit
        for _ in 0..3 {
            assert_rejected(
                engine,
                l.check_all_blocking(&layers),
                "layers[1]",
                "uploads",
            );
            let l2 = l.clone();
            let layers2 = layers.clone();
            let r = l.block_on(async move { l2.check_all(&layers2).await });
            assert_rejected(engine, r, "layers[1]", "uploads");
        }
        // the first layer alone is a concurrency policy: layers[0]
        let only = [Layer::new("u", &uploads, 1)];
        assert_rejected(engine, l.check_all_blocking(&only), "layers[0]", "uploads");
        // nothing was taken from either layer
        assert_eq!(l.peek_blocking("u", &ip).unwrap().remaining, 10, "{engine}");
        let (d, lease) = l.acquire_blocking("u", &uploads, 2).unwrap();
        assert!(d.allowed, "{engine}: the layered checks held units: {d:?}");
        assert!(l.release_blocking(&lease.unwrap()).unwrap(), "{engine}");
    }
    // and nothing reached Redis: no key was written
    let n: u64 = redis::cmd("DBSIZE").query(&mut server.conn()).unwrap();
    assert_eq!(n, 0, "the rejected layered checks wrote to Redis");
}

#[test]
fn the_shadow_and_override_paths_reject_it_too() {
    let server = RedisServer::start();
    for (engine, l) in engines(&server) {
        let watch = l.policy("watch").unwrap();
        let tenant = l.policy("tenant").unwrap();
        let uploads = l.policy("uploads").unwrap();
        let jobs = l.policy("jobs").unwrap();
        // a layer in shadow sends the check down the shadow path
        let shadowed = [Layer::new("u", &watch, 1), Layer::new("u", &uploads, 1)];
        assert_rejected(
            engine,
            l.check_all_blocking(&shadowed),
            "layers[1]",
            "uploads",
        );
        // a layer that takes overrides sends it down the override path, with an override
        // in force on the concurrency policy and on the rate policy
        l.set_override_blocking("u", "jobs", r#"{"max": 5, "lease_ttl": "30s"}"#, None)
            .unwrap();
        l.set_override_blocking("u", "tenant", "100/minute", None)
            .unwrap();
        let overridden = [Layer::new("u", &tenant, 1), Layer::new("u", &jobs, 1)];
        assert_rejected(
            engine,
            l.check_all_blocking(&overridden),
            "layers[1]",
            "jobs",
        );
        let mixed = [
            Layer::new("u", &jobs, 1),
            Layer::new("v", &watch, 1),
            Layer::new("w", &tenant, 1),
        ];
        assert_rejected(engine, l.check_all_blocking(&mixed), "layers[0]", "jobs");
        assert_eq!(
            l.peek_blocking("u", &watch).unwrap().remaining,
            10,
            "{engine}"
        );
        assert_eq!(
            l.peek_blocking("u", &tenant).unwrap().remaining,
            100,
            "{engine}"
        );
        assert_eq!(
            l.peek_blocking("w", &tenant).unwrap().remaining,
            10,
            "{engine}"
        );
        let (d, lease) = l.acquire_blocking("u", &jobs, 5).unwrap();
        assert!(d.allowed, "{engine}: the layered checks held units: {d:?}");
        assert!(l.release_blocking(&lease.unwrap()).unwrap(), "{engine}");
    }
}

#[test]
fn rate_layers_still_check_together() {
    let server = RedisServer::start();
    for (engine, l) in engines(&server) {
        let (ip, tenant) = (l.policy("ip").unwrap(), l.policy("tenant").unwrap());
        let d = l
            .check_all_blocking(&[Layer::new("u", &ip, 4), Layer::new("u", &tenant, 3)])
            .unwrap();
        assert!(d.allowed, "{engine}");
        assert_eq!((d.layer, d.remaining), (Some(0), 6), "{engine}: {d:?}");
    }
}
