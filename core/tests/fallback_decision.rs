//! `Limiter::fallback_decision`: the policies' `on_error` modes decide without the backend,
//! for a caller whose own deadline passed (shardlimit serve answering within Envoy's).

use shardlimit::{Error, ErrorKind, Layer, Limit, Limiter, OnError, Policy, Source};
use std::time::Duration;

fn policy(name: &str, on_error: OnError) -> Policy {
    Policy::new(name, Limit::fixed_window(10, Duration::from_secs(60)))
        .unwrap()
        .with_on_error(on_error)
}

fn timeout() -> Error {
    Error::Timeout {
        shard: "gateway".into(),
        timeout_ms: 15,
    }
}

#[test]
fn each_layer_decides_by_its_on_error_mode() {
    let l = Limiter::memory();
    let open = policy("open", OnError::Open);
    let closed = policy("closed", OnError::Closed);

    let d = l
        .fallback_decision(&[Layer::new("k", &open, 1)], timeout())
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.source, Source::Fallback);
    assert!(!d.measured());
    assert_eq!(d.layer, None, "one layer: no index");

    let d = l
        .fallback_decision(
            &[Layer::new("k", &open, 1), Layer::new("k", &closed, 1)],
            timeout(),
        )
        .unwrap();
    assert!(!d.allowed, "closed denies");
    assert_eq!(d.layer, Some(1));
    assert_eq!(d.retry_after, Some(shardlimit::CLOSED_RETRY_AFTER));

    // a cost of 0 is a peek: local decides without consuming
    let local = policy("local", OnError::Local);
    for _ in 0..3 {
        let d = l
            .fallback_decision(&[Layer::new("k", &local, 0)], timeout())
            .unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, d.limit, "a peek consumed nothing");
    }
}

#[test]
fn on_error_error_returns_the_error_and_no_layers_is_invalid() {
    let l = Limiter::memory();
    let e = l
        .fallback_decision(
            &[
                Layer::new("k", &policy("open", OnError::Open), 1),
                Layer::new("k", &policy("err", OnError::Error), 1),
            ],
            timeout(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    let e = l.fallback_decision(&[], timeout()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}
