//! Test support: real `redis-server` processes on loopback ports, one per test, stopped
//! when dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
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
        Self::start_on(free_port())
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
        Self::start_with(free_port(), extra.iter().map(|s| s.to_string()).collect())
    }

    /// A server with extra command-line arguments (e.g. `--replicaof host port`).
    pub fn start_with(port: u16, extra: Vec<String>) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let child = Command::new("redis-server")
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
            .expect("redis-server must be installed (make test installs it)");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Starts the server again after [`RedisServer::kill`], same port and directory.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                // a cluster node answers PING before its cluster is formed: that is enough
                match redis::cmd("PING").query::<String>(&mut c) {
                    Ok(_) => return,
                    // with --requirepass it answers, just not to strangers
                    Err(e) if e.to_string().contains("NOAUTH") => return,
                    Err(_) => {}
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

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
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
