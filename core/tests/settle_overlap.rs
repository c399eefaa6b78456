//! A sliding-log settle after a refund took units from the reservation's own entry: the
//! books stay exact. `settle.rs`'s 64 concurrent settles failed on this under load (the
//! refund of one caller ate into another's reservation entry, whose settle then found no
//! entry of its size and gave nothing back); here the same interleaving, step by step.

mod support;

use shardlimit::{Limit, Limiter, ManualClock, Policy};
use std::time::Duration;
use support::RedisServer;

const T0: u64 = 1_800_000_000_000_000;

fn engines(server: &RedisServer) -> Vec<(&'static str, Limiter)> {
    redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
    let redis = Limiter::from_json(&support::config(&[server], "{}")).unwrap();
    [("redis", redis), ("memory", Limiter::memory())]
        .into_iter()
        .map(|(n, l)| (n, l.with_clock(ManualClock::new(T0)).unwrap()))
        .collect()
}

#[test]
fn a_settle_after_a_refund_of_its_own_units_gives_back_the_rest() {
    let server = RedisServer::start();
    let limit = 1000;
    let p = Policy::new("sl", Limit::sliding_log(limit, Duration::from_secs(3600))).unwrap();
    for (engine, l) in engines(&server) {
        // A and B reserve 10 each at the same instant; the refund takes the newest unit
        // (B's entry); both settle at 4: 6 + 6 units go back.
        let (_, a) = l.reserve_blocking("k", &p, 10).unwrap();
        let (_, b) = l.reserve_blocking("k", &p, 10).unwrap();
        l.refund_blocking("k", &p, 1).unwrap();
        l.settle_with_blocking(&p, &a.unwrap(), 4).unwrap();
        l.settle_with_blocking(&p, &b.unwrap(), 4).unwrap();
        let d = l.peek_blocking("k", &p).unwrap();
        assert_eq!(d.remaining, limit - (4 + 4 - 1), "{engine}: {d:?}");
        // one reservation alone, its entry the newest when the refund comes
        let (_, c) = l.reserve_blocking("c", &p, 10).unwrap();
        l.refund_blocking("c", &p, 1).unwrap();
        l.settle_with_blocking(&p, &c.unwrap(), 4).unwrap();
        let d = l.peek_blocking("c", &p).unwrap();
        assert_eq!(d.remaining, limit - 3, "{engine}: {d:?}");
    }
}
