//! A config that needs more connections than the process may open file descriptors is
//! refused when the limiter is made, with the figures: one connection per shard per
//! process at least, so 3000 shards under `ulimit -n 1024` sent two checks in three to the
//! fallback. (One test in its own process: it lowers the process's RLIMIT_NOFILE.)

#![cfg(unix)]

use shardlimit::Limiter;

fn shards(n: usize) -> String {
    let list: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"name":"s{i}","url":"redis://127.0.0.1:{}"}}"#,
                1 + i % 60000
            )
        })
        .collect();
    format!(r#"{{"shards":[{}], "policies": {{}}}}"#, list.join(","))
}

#[test]
fn a_config_the_file_descriptor_limit_cannot_hold_is_refused() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim.rlim_cur = 1024.min(lim.rlim_max);
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let soft = lim.rlim_cur as usize;

    let Err(e) = Limiter::from_json(&shards(3000)) else {
        panic!("3000 shards made under RLIMIT_NOFILE {soft}")
    };
    assert!(e.is_config(), "{e}");
    let m = e.to_string();
    for what in [
        "3000 shards",
        "RLIMIT_NOFILE",
        &soft.to_string(),
        "ulimit -n",
    ] {
        assert!(m.contains(what), "{what:?} not in: {m}");
    }
    // what fits is made (no connection is opened until a check)
    Limiter::from_json(&shards(soft / 2)).unwrap();
    // a reload to a config that does not fit is refused, and the old one stays
    let l = Limiter::from_json(&shards(2)).unwrap();
    let Err(e) = l.reload(shardlimit::Config::from_json(&shards(3000)).unwrap()) else {
        panic!("a reload to 3000 shards applied under RLIMIT_NOFILE {soft}")
    };
    assert!(e.to_string().contains("RLIMIT_NOFILE"), "{e}");
    assert_eq!(l.config().shards.as_ref().unwrap().len(), 2);
}
