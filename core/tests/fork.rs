//! A limiter created (and used) before fork() keeps working in the child: the core sees the
//! new pid and re-creates its runtime and Redis connections there.

mod support;

use shardlimit::{Limit, Limiter, Policy};

#[test]
fn limiter_works_in_a_forked_child() {
    let server = support::RedisServer::start();
    let limiter = Limiter::from_json(&support::config(&[&server], "{}")).unwrap();
    let p = Policy::new(
        "f",
        Limit::fixed_window(10, std::time::Duration::from_secs(3600)),
    )
    .unwrap();
    // the parent's runtime and connection exist before the fork
    assert_eq!(limiter.check_blocking("k", &p, 3).unwrap().remaining, 7);
    // SAFETY: the child only runs Rust code that allocates fresh runtime state and exits
    // with _exit; this test binary holds no locks across the fork point.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = match limiter.check_blocking("k", &p, 2) {
            Ok(d) if d.allowed && d.remaining == 5 => 0,
            Ok(_) => 3,
            Err(_) => 4,
        };
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child crashed: status {status}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child's check failed (3 = wrong decision, 4 = error)"
    );
    // the parent still works, and sees the child's consumption
    assert_eq!(limiter.check_blocking("k", &p, 1).unwrap().remaining, 4);
}
