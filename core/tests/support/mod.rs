//! Test support: real `redis-server` processes on loopback ports, one per test, stopped
//! when dropped.
#![allow(dead_code)]

mod cluster;
#[allow(unused_imports)] // only the Cluster tests use it
pub use cluster::Cluster;
mod racing;
#[allow(unused_imports)] // only the override tests use it
pub use racing::assert_decided_by_one_limit;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// The TLS port of a server made by [`RedisServer::start_tls`].
    pub tls_port: Option<u16>,
}

/// A throw-away PKI made by `tests/tls/gen-certs.sh` (openssl): a CA, a server certificate
/// signed by it for the given subject alternative names, a client certificate signed by it,
/// and a second CA that signed nothing here.
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// Certificates for `san` (`"DNS:localhost,IP:127.0.0.1"`, `"DNS:localhost"`, ...).
    pub fn generate(san: &str) -> TestCerts {
        let dir = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/tls/gen-certs.sh");
        let out = Command::new("sh")
            .arg(script)
            .arg(dir.path())
            .arg(san)
            .output()
            .expect("sh and openssl must be installed");
        assert!(
            out.status.success(),
            "gen-certs.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestCerts { dir }
    }

    /// The path of `name` (`ca.crt`, `server.key`, `client.crt`, `other-ca.crt`, ...), as a
    /// string for a JSON config.
    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// The server binary the tests start: `$SHARDLIMIT_REDIS_SERVER` when set (a
/// `valkey-server`, for the suites' Valkey run: `scripts/test-valkey.sh`), else
/// `redis-server` from `PATH`.
pub fn server_binary() -> String {
    std::env::var("SHARDLIMIT_REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers PING.
    pub fn start() -> RedisServer {
        Self::start_free(Vec::new)
    }

    /// A server on a port chosen here, with the arguments `extra()`: a port found free can
    /// be taken by another test's server before this one binds it (the kernel hands a
    /// released port out again), so on a failed bind it starts again on another port.
    fn start_free(extra: impl Fn() -> Vec<String>) -> RedisServer {
        for _ in 0..10 {
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir: tempfile::tempdir().unwrap(),
                extra: extra(),
                tls_port: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("no free port for redis-server after 10 tries");
    }

    pub fn start_on(port: u16) -> RedisServer {
        Self::start_with(port, Vec::new())
    }

    /// A node for a Redis Cluster (its nodes.conf lives in the server's own directory).
    pub fn start_cluster_node() -> RedisServer {
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1500",
        ];
        Self::start_free(|| extra.iter().map(|s| s.to_string()).collect())
    }

    /// A server with extra command-line arguments (e.g. `--replicaof host port`).
    pub fn start_with(port: u16, extra: Vec<String>) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra,
            tls_port: None,
        };
        assert!(
            server.spawn(),
            "redis-server could not listen on port {port} (taken by another process)"
        );
        server
    }

    /// A server that also listens for TLS on a second free loopback port, with the server
    /// certificate of `certs`; `auth_clients`: it requires a client certificate signed by the
    /// test CA (mTLS). The plain port stays open, for the test's own inspection.
    pub fn start_tls(certs: &TestCerts, auth_clients: bool) -> RedisServer {
        Self::start_tls_with(certs, auth_clients, &[])
    }

    /// [`RedisServer::start_tls`] with `more` command-line arguments.
    pub fn start_tls_with(certs: &TestCerts, auth_clients: bool, more: &[&str]) -> RedisServer {
        let tls_port = std::cell::Cell::new(0);
        let mut server = Self::start_free(|| {
            tls_port.set(free_port());
            let mut extra = vec![
                "--tls-port".to_string(),
                tls_port.get().to_string(),
                "--tls-cert-file".to_string(),
                certs.path("server.crt"),
                "--tls-key-file".to_string(),
                certs.path("server.key"),
                "--tls-ca-cert-file".to_string(),
                certs.path("ca.crt"),
                "--tls-auth-clients".to_string(),
                if auth_clients { "yes" } else { "no" }.to_string(),
            ];
            extra.extend(more.iter().map(|s| s.to_string()));
            extra
        });
        server.tls_port = Some(tls_port.get());
        server.wait_tls_ready();
        server
    }

    /// Waits until the TLS port accepts TCP connections (the plain port answering PING
    /// means the server has loaded its config, so this is at once in practice).
    fn wait_tls_ready(&self) {
        let port = self.tls_port.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen for TLS on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `rediss://HOST:TLS_PORT`.
    pub fn tls_url(&self, host: &str) -> String {
        format!(
            "rediss://{host}:{}",
            self.tls_port.expect("not a TLS server")
        )
    }

    /// Starts the process and waits until it answers on its port; false when it could not
    /// listen there (it exited: another process holds the port).
    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let child = Command::new(server_binary())
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{} must be installed (make test installs it): {e}",
                    server_binary()
                )
            });
        self.child = Some(child);
        self.wait_ready()
    }

    /// Starts the server again after [`RedisServer::kill`], same port and directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        assert!(
            self.spawn(),
            "redis-server could not listen on port {} again (taken by another process)",
            self.port
        );
    }

    /// Waits until this process (not another test's server on the same port) answers on
    /// the port; false when it exited first (it could not listen there).
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = self.pid();
        let password = self
            .extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| self.extra.get(i + 1).cloned());
        loop {
            if let Some(Some(_)) = self.child.as_mut().map(|c| c.try_wait().unwrap()) {
                self.child = None;
                return false;
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                if let Some(pw) = &password {
                    let _ = redis::cmd("AUTH").arg(pw).exec(&mut c);
                }
                // a cluster node answers before its cluster is formed: that is enough
                if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut c) {
                    let id = info
                        .lines()
                        .find_map(|l| l.strip_prefix("process_id:"))
                        .and_then(|v| v.trim().parse::<u32>().ok());
                    if id == Some(pid) {
                        return true;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// A connection, or the error of making one: for polling a server that may be closing
    /// its clients (a primary Sentinel demotes drops them), where a refused or reset
    /// connection means "not yet" rather than a failed test.
    #[allow(dead_code)] // not every test binary that includes support polls a server
    pub fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// The EVALSHA and EVAL calls the server has run so far (`INFO commandstats`).
    pub fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
            .iter()
            .filter_map(|p| info.lines().find_map(|l| l.strip_prefix(p)))
            .map(|rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// CPU time the server's main thread has used (µs), from `INFO cpu`: the server's own
    /// account of the work commands cost it, which time spent waiting for a CPU (the test
    /// machine is shared) does not inflate, unlike SLOWLOG's wall-clock durations.
    pub fn main_thread_cpu_us(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query(&mut self.conn())
            .unwrap();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap()
        };
        ((field("used_cpu_sys_main_thread:") + field("used_cpu_user_main_thread:")) * 1e6) as u64
    }

    /// Stops the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A JSON config with one shard per server and the given policies (a JSON object text).
pub fn config(servers: &[&RedisServer], policies: &str) -> String {
    let shards: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| format!(r#"{{"name":"s{i}","url":"{}"}}"#, s.url()))
        .collect();
    format!(
        r#"{{"timeout_ms": 2000, "shards":[{}], "policies": {policies}}}"#,
        shards.join(",")
    )
}

/// A loopback TCP relay in front of a real server that holds every chunk of the server's
/// replies for `delay` from its arrival before passing it on: a slow network or a slow server, with a known
/// lower bound on each reply's latency. Requests pass straight through. It runs until the
/// test process ends.
pub struct SlowReplies {
    pub port: u16,
}

impl SlowReplies {
    pub fn start(upstream_port: u16, delay: Duration) -> SlowReplies {
        use std::io::{Read, Write};
        use std::net::TcpStream;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n @ 1..) = c_in.read(&mut buf) {
                        if s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_out.shutdown(std::net::Shutdown::Write);
                });
                // each chunk is held `delay` from when it arrived, not after the one before
                let (mut s_in, mut c_out) = (server, client);
                let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n @ 1..) = s_in.read(&mut buf) {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                });
                std::thread::spawn(move || {
                    for (due, chunk) in rx {
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        if c_out.write_all(&chunk).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        SlowReplies { port }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// A check that takes `cost` units of any policy: those of a concurrency policy are
/// acquired (a plain check of one is an error), their lease dropped to expire after its
/// `lease_ttl`, as every unit taken in tests that check every algorithm alike.
pub fn take_blocking(
    l: &shardlimit::Limiter,
    key: &str,
    p: &shardlimit::Policy,
    cost: u64,
) -> shardlimit::Result<shardlimit::Decision> {
    match p.algorithm() {
        shardlimit::Algorithm::Concurrency => l.acquire_blocking(key, p, cost).map(|(d, _)| d),
        _ => l.check_blocking(key, p, cost),
    }
}

/// [`take_blocking`] for async callers.
pub async fn take(
    l: &shardlimit::Limiter,
    key: &str,
    p: &shardlimit::Policy,
    cost: u64,
) -> shardlimit::Result<shardlimit::Decision> {
    match p.algorithm() {
        shardlimit::Algorithm::Concurrency => l.acquire(key, p, cost).await.map(|(d, _)| d),
        _ => l.check(key, p, cost).await,
    }
}

/// A boxed future, as the burst replays build them.
pub type BoxFut<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Polls `futs` in their order, each until it waits, all in one task: on the I/O runtime
/// (a current-thread runtime) every check is queued on the pipe before the pipe's writer
/// can run, so the writer sends the burst's checks of one algorithm as one batch call, in
/// this order. Unconstrained by tokio's budget, so that no check yields before queuing.
pub async fn in_order<T>(mut futs: Vec<BoxFut<T>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    tokio::task::unconstrained(std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    }))
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// One command a client sent, as a fake server reads it (an array of bulk strings): its
/// arguments, or `None` at the end of the stream or on anything else.
pub fn read_command(r: &mut std::io::BufReader<std::net::TcpStream>) -> Option<Vec<Vec<u8>>> {
    use std::io::{BufRead, Read};
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0; len + 2];
        r.read_exact(&mut buf).ok()?;
        buf.truncate(len);
        args.push(buf);
    }
    Some(args)
}

/// A fake server's listener on a loopback port: every connection is counted and handed to
/// `serve` on a thread of its own, until this is dropped (the hostile-reply fakes' shared
/// part; what each fake answers is its `serve`).
pub struct Accepting {
    pub port: u16,
    /// connections accepted so far
    pub connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Accepting {
    pub fn start(serve: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> Accepting {
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = Accepting {
            port: listener.local_addr().unwrap().port(),
            connections: Arc::default(),
            stop: Arc::default(),
        };
        let (conns, stop, serve) = (a.connections.clone(), a.stop.clone(), Arc::new(serve));
        std::thread::spawn(move || {
            for s in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(s) = s else { continue };
                conns.fetch_add(1, Ordering::AcqRel);
                let serve = serve.clone();
                std::thread::spawn(move || serve(s));
            }
        });
        a
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        // (wakes the accept loop up to see `stop`)
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}
