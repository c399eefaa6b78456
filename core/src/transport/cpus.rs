//! How many CPUs this process may use, read once: the CPUs it may be scheduled on
//! (`sched_getaffinity`, through `std::thread::available_parallelism`) and its cgroup's CPU
//! quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), whichever is smaller.
//!
//! Spinning on a socket only pays when another CPU is free to run the thread that the
//! spinner waits for (the event loop, Redis): with one usable CPU a spinning thread takes
//! the very CPU the answer needs. So `spin_wait` defaults to 0 there
//! ([`crate::config::default_spin_wait`]).

use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

/// Where cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The CPUs this process may use (at least 1), read once at first use.
pub(crate) fn usable() -> usize {
    static USABLE: LazyLock<usize> = LazyLock::new(|| {
        let affinity = std::thread::available_parallelism().map_or(1, |n| n.get());
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        usable_with(affinity, quota_cpus(Path::new(CGROUP_ROOT), &own))
    });
    *USABLE
}

/// `affinity` CPUs under a quota of `quota` CPUs (`None`: no quota): a quota of 1.5 CPUs
/// leaves no second core free, so it counts as 1.
fn usable_with(affinity: usize, quota: Option<f64>) -> usize {
    let by_quota = quota.map_or(usize::MAX, |q| (q.floor() as usize).max(1));
    affinity.min(by_quota).max(1)
}

/// The CPU quota (in CPUs) of the cgroup that `proc_self_cgroup` (the text of
/// `/proc/self/cgroup`) names under `root`: the smallest quota on the way from that cgroup
/// up to the root, `None` when there is none (or nothing readable).
fn quota_cpus(root: &Path, proc_self_cgroup: &str) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut take = |q: Option<f64>| {
        if let Some(q) = q {
            best = Some(best.map_or(q, |b: f64| b.min(q)));
        }
    };
    for line in proc_self_cgroup.lines() {
        // hierarchy-ID:controllers:path
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if path.split('/').any(|c| c == "..") {
            continue;
        }
        if controllers.is_empty() {
            // v2: one unified hierarchy
            for dir in ancestors(&root.join(relative(path)), root) {
                take(read_cpu_max(&dir.join("cpu.max")));
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            // v1: the cpu controller's own hierarchy, mounted as "cpu" or "cpu,cpuacct"
            for mount in [root.join(controllers), root.join("cpu")] {
                if !mount.is_dir() {
                    continue;
                }
                for dir in ancestors(&mount.join(relative(path)), &mount) {
                    take(read_cfs(dir));
                }
                break;
            }
        }
    }
    best
}

fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// `dir` and its parents up to `top`, both included (nothing when `dir` is not under it).
fn ancestors<'a>(dir: &'a Path, top: &'a Path) -> impl Iterator<Item = &'a Path> {
    dir.ancestors()
        .take_while(move |d| d.starts_with(top))
        .filter(|d| d.is_dir())
}

/// cgroup v2 `cpu.max`: `"$MAX $PERIOD"`, `$MAX` being `max` when unlimited.
fn read_cpu_max(file: &Path) -> Option<f64> {
    parse_cpu_max(&std::fs::read_to_string(file).ok()?)
}

fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut it = text.split_whitespace();
    let quota = it.next()?;
    let period: f64 = it.next().map_or(Some(100_000.0), |p| p.parse().ok())?;
    if quota == "max" {
        return None;
    }
    ratio(quota.parse().ok()?, period)
}

/// cgroup v1: `cpu.cfs_quota_us` (-1 when unlimited) over `cpu.cfs_period_us`.
fn read_cfs(dir: &Path) -> Option<f64> {
    let quota: f64 = std::fs::read_to_string(dir.join("cpu.cfs_quota_us"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let period: f64 = std::fs::read_to_string(dir.join("cpu.cfs_period_us"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    ratio(quota, period)
}

fn ratio(quota: f64, period: f64) -> Option<f64> {
    (quota > 0.0 && period > 0.0 && quota.is_finite() && period.is_finite()).then(|| quota / period)
}

/// How a blocking caller waits for its reply on the socket before sleeping in `read`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spin {
    /// How long, at most (0: sleep in `read` at once).
    pub wait: Duration,
    /// Give way to every other ready thread between two looks at the socket, and stop
    /// spinning at the first look that another thread ran in between (the spinner was
    /// switched out, or the yield took over [`YIELD_RAN_OTHERS`]): a spinner on one CPU
    /// then only takes time that would have
    /// gone idle.
    pub yielding: bool,
}

impl Spin {
    pub(crate) const OFF: Spin = Spin {
        wait: Duration::ZERO,
        yielding: false,
    };
}

/// A `sched_yield` that took longer than this let another thread run.
pub(crate) const YIELD_RAN_OTHERS: Duration = Duration::from_micros(20);

/// How blocking callers spin, from the config's `spin_wait` (`configured`: the config set
/// it) and the CPUs the process may use: as the config says when it says, or when there
/// is a CPU to spare; on one usable CPU, by default, for up to
/// [`crate::config::DEFAULT_SPIN_WAIT`] while yielding (the I/O thread does not spin there:
/// its spinning would take the CPU its own callers need). A lone caller then gets its
/// reply without the wake-up of a sleeping thread (about as long as the round trip on a
/// virtual machine), and a caller among busy threads sleeps after one yield.
pub(crate) fn blocking_spin(spin_wait: Duration, configured: bool, usable: usize) -> Spin {
    if configured || usable > 1 {
        Spin {
            wait: spin_wait,
            yielding: false,
        }
    } else {
        Spin {
            wait: crate::config::DEFAULT_SPIN_WAIT,
            yielding: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn cpu_max_is_read_as_a_number_of_cpus() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2.0));
        assert_eq!(parse_cpu_max("150000\n"), Some(1.5)); // the period defaults to 100 ms
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("lots 100000"), None);
        assert_eq!(parse_cpu_max("100000 0"), None);
        assert_eq!(parse_cpu_max("-5 100000"), None);
    }

    #[test]
    fn the_smallest_quota_from_the_cgroup_up_to_the_root_counts_v2() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("kubepods/pod1/app");
        fs::create_dir_all(&leaf).unwrap();
        fs::write(root.path().join("cpu.max"), "max 100000\n").unwrap();
        fs::write(root.path().join("kubepods/cpu.max"), "400000 100000\n").unwrap();
        fs::write(root.path().join("kubepods/pod1/cpu.max"), "150000 100000\n").unwrap();
        fs::write(leaf.join("cpu.max"), "max 100000\n").unwrap();
        let q = quota_cpus(root.path(), "0::/kubepods/pod1/app\n");
        assert_eq!(q, Some(1.5));
        assert_eq!(usable_with(2, q), 1, "1.5 CPUs leave no second core free");
        assert_eq!(usable_with(8, Some(3.0)), 3);
        assert_eq!(usable_with(2, Some(0.25)), 1, "never below one");
        // no quota anywhere: the affinity alone
        fs::write(root.path().join("kubepods/cpu.max"), "max 100000\n").unwrap();
        fs::write(root.path().join("kubepods/pod1/cpu.max"), "max 100000\n").unwrap();
        let q = quota_cpus(root.path(), "0::/kubepods/pod1/app\n");
        assert_eq!(q, None);
        assert_eq!(usable_with(2, q), 2);
        assert_eq!(usable_with(1, q), 1, "pinned to one CPU (taskset)");
    }

    #[test]
    fn the_cpu_controller_of_cgroup_v1_counts_too() {
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("cpu,cpuacct/docker/abc");
        fs::create_dir_all(&cg).unwrap();
        fs::write(cg.join("cpu.cfs_quota_us"), "100000\n").unwrap();
        fs::write(cg.join("cpu.cfs_period_us"), "100000\n").unwrap();
        fs::write(root.path().join("cpu,cpuacct/cpu.cfs_quota_us"), "-1\n").unwrap();
        fs::write(
            root.path().join("cpu,cpuacct/cpu.cfs_period_us"),
            "100000\n",
        )
        .unwrap();
        let own = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
        assert_eq!(quota_cpus(root.path(), own), Some(1.0));
        // unlimited (-1) and unreadable files are no quota
        fs::write(cg.join("cpu.cfs_quota_us"), "-1\n").unwrap();
        assert_eq!(quota_cpus(root.path(), own), None);
        fs::write(cg.join("cpu.cfs_quota_us"), "garbage\n").unwrap();
        assert_eq!(quota_cpus(root.path(), own), None);
        // a path out of the hierarchy, or a malformed line, reads nothing
        fs::write(cg.join("cpu.cfs_quota_us"), "100000\n").unwrap();
        assert_eq!(
            quota_cpus(root.path(), "4:cpu,cpuacct:/docker/abc/../abc\n"),
            None
        );
        assert_eq!(quota_cpus(root.path(), "garbage\n\n"), None);
    }

    /// Pinned to one CPU (the test runs itself again under `taskset -c 0`), nothing spins
    /// by default; a config's own `spin_wait` still holds.
    #[test]
    fn pinned_to_one_cpu_the_default_spin_wait_is_zero() {
        use crate::config::{default_spin_wait, Config, DEFAULT_SPIN_WAIT};
        use std::time::Duration;
        if std::env::var_os("SHARDLIMIT_TEST_PINNED").is_some() {
            assert_eq!(usable(), 1);
            assert_eq!(default_spin_wait(), Duration::ZERO);
            assert_eq!(Config::default().effective_spin_wait(), Duration::ZERO);
            let own = Config::from_json(r#"{"spin_wait":"50us","policies":{}}"#).unwrap();
            assert_eq!(own.spin_wait, Some(Duration::from_micros(50)));
            // blocking callers still spin by default, yielding; a config's own value holds
            let d = Config::default();
            assert_eq!(
                blocking_spin(d.effective_spin_wait(), d.spin_wait.is_some(), usable()),
                Spin {
                    wait: DEFAULT_SPIN_WAIT,
                    yielding: true
                }
            );
            assert_eq!(
                blocking_spin(own.effective_spin_wait(), own.spin_wait.is_some(), usable()),
                Spin {
                    wait: Duration::from_micros(50),
                    yielding: false
                }
            );
            return;
        }
        // this test's own name, wherever the module sits in the crate
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let name = format!("{module}::pinned_to_one_cpu_the_default_spin_wait_is_zero");
        let out = std::process::Command::new("taskset")
            .args(["-c", "0"])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", name.as_str()])
            .env("SHARDLIMIT_TEST_PINNED", "1")
            .output()
            .expect("taskset (util-linux) runs the pinned half of this test");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "pinned run failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if usable() > 1 {
            assert_eq!(default_spin_wait(), DEFAULT_SPIN_WAIT);
        }
    }

    /// The blocking callers' spin: the config's when it sets one (0 included), the
    /// config's default with a CPU to spare, and yielding for the default time on one CPU.
    #[test]
    fn blocking_callers_spin_yielding_only_on_one_cpu_and_by_default() {
        use crate::config::DEFAULT_SPIN_WAIT;
        let us = Duration::from_micros;
        let plain = |wait| Spin {
            wait,
            yielding: false,
        };
        assert_eq!(blocking_spin(us(100), false, 2), plain(us(100)));
        assert_eq!(blocking_spin(us(0), true, 2), plain(us(0)));
        assert_eq!(blocking_spin(us(0), true, 1), plain(us(0)));
        assert_eq!(blocking_spin(us(300), true, 1), plain(us(300)));
        let yielding = Spin {
            wait: DEFAULT_SPIN_WAIT,
            yielding: true,
        };
        assert_eq!(blocking_spin(us(0), false, 1), yielding);
        assert_eq!(Spin::OFF, plain(us(0)));
    }

    #[test]
    fn this_process_may_use_at_least_one_cpu() {
        assert!(usable() >= 1);
        assert!(usable() <= std::thread::available_parallelism().map_or(1, |n| n.get()));
    }
}
