//! Engine, reload, scale, health and metrics.

use super::*;

#[test]
fn engine_reload_scale_health_and_metrics() {
    let f = Fixture::new();
    unsafe {
        assert!(!shardlimit_is_redis(f.lim));
        assert!(!shardlimit_is_redis(null()));
        let (mut has, mut n) = (true, 99usize);
        f.check("user:1", "api", 1);
        assert_eq!(
            shardlimit_memory_keys(f.lim, &mut has, &mut n, null_mut()),
            SHARDLIMIT_OK
        );
        assert!(has && n >= 1, "{has} {n}");
        let (mut idx, mut name) = (
            0u32,
            shardlimit_string {
                ptr: null_mut(),
                len: 0,
            },
        );
        let mut e = null_mut();
        assert_eq!(
            shardlimit_route(f.lim, "k".as_ptr().cast(), 1, &mut idx, &mut name, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        assert!(take_err(e).1.contains("memory"));
        // scale: every policy's limit, then back
        assert_eq!(shardlimit_scale(f.lim), 1.0);
        assert_eq!(
            shardlimit_set_scale(f.lim, 0.5, null(), 0, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(shardlimit_scale(f.lim), 0.5);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_set_scale(f.lim, 2.0, null(), 0, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        take_err(e);
        let unknown = [shardlimit_str {
            ptr: c"nope".as_ptr(),
            len: 4,
        }];
        let mut e = null_mut();
        assert_eq!(
            shardlimit_set_scale(f.lim, 0.5, unknown.as_ptr(), 1, &mut e),
            SHARDLIMIT_ERR_UNKNOWN_POLICY
        );
        take_err(e);
        // health: no hook is an error; the latency hook halves at twice the target
        let mut factor = 0.0;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_observe_health(f.lim, 0.1, &mut factor, &mut e),
            SHARDLIMIT_ERR_INVALID_ARGUMENT
        );
        take_err(e);
        assert_eq!(
            shardlimit_set_latency_scale(f.lim, 100_000, 0.1, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(
            shardlimit_observe_health(f.lim, 0.2, &mut factor, null_mut()),
            SHARDLIMIT_OK
        );
        assert!((factor - 0.5).abs() < 1e-9, "{factor}");
        assert_eq!(
            shardlimit_observe_health(f.lim, 0.05, &mut factor, null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(factor, 1.0);
        // reload: the new limit applies to the next check, a bad config changes nothing
        let cfg = r#"{"policies":{"api":{"algorithm":"fixed_window","limit":7,"window":"10s"}}}"#;
        assert_eq!(
            shardlimit_reload(f.lim, cfg.as_ptr().cast(), cfg.len(), null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(f.check("user:2", "api", 1).limit, 7);
        let bad = r#"{"policies":{"api":{"algorithm":"fixed_window","limit":0,"window":"10s"}}}"#;
        let mut e = null_mut();
        assert_eq!(
            shardlimit_reload(f.lim, bad.as_ptr().cast(), bad.len(), &mut e),
            SHARDLIMIT_ERR_CONFIG
        );
        assert!(take_err(e).1.contains("limit"));
        assert_eq!(f.check("user:3", "api", 1).limit, 7);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(&path, cfg.replace('7', "8")).unwrap();
        let p = path.to_str().unwrap();
        assert_eq!(
            shardlimit_reload_from_file(f.lim, p.as_ptr().cast(), p.len(), null_mut()),
            SHARDLIMIT_OK
        );
        assert_eq!(f.check("user:4", "api", 1).limit, 8);
        let mut e = null_mut();
        assert_eq!(
            shardlimit_reload_from_file(f.lim, "/nonexistent/x.json".as_ptr().cast(), 19, &mut e),
            SHARDLIMIT_ERR_IO
        );
        take_err(e);
        // metrics: JSON and Prometheus text, with the checks made above
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_metrics(f.lim, &mut out, null_mut()),
            SHARDLIMIT_OK
        );
        let json: serde_json::Value = serde_json::from_str(&owned(out)).unwrap();
        let api = json["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == "api")
            .expect("api's counters");
        // (one check since the last reload: the core's reload restarts the counters today)
        assert!(api["allowed"].as_u64().unwrap() >= 1, "{json}");
        let mut out = shardlimit_string {
            ptr: null_mut(),
            len: 0,
        };
        assert_eq!(
            shardlimit_metrics_prometheus(f.lim, &mut out, null_mut()),
            SHARDLIMIT_OK
        );
        let text = owned(out);
        assert!(text.contains("policy=\"api\""), "{text}");
    }
}
