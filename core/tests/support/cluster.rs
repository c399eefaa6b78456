//! A Redis Cluster for tests: three primaries on loopback ports
//! (`redis-server --cluster-enabled yes` ×3, `redis-cli --cluster create`), ready when every
//! node reports `cluster_state:ok`.

use super::RedisServer;
use std::ops::{Deref, DerefMut};
use std::process::Command;
use std::time::{Duration, Instant};

/// The nodes of a cluster (`nodes[i]`, `nodes.iter()` through `Deref`), stopped when dropped.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    /// Three primaries holding every slot, no replicas; waits (at most 30 s) until each
    /// node says the cluster is ok.
    pub fn start() -> Cluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_cluster_node()).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        cluster.wait_ok("cluster_state:ok");
        cluster
    }

    /// A JSON config of this cluster (`"cluster": {"nodes": [...]}`, every node a seed)
    /// with the given deadline and policies (a JSON object text).
    pub fn config(&self, timeout_ms: u64, policies: &str) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"{}\"", n.url()))
            .collect();
        format!(
            r#"{{"timeout_ms": {timeout_ms}, "cluster": {{"nodes": [{}]}}, "policies": {policies}}}"#,
            urls.join(",")
        )
    }

    /// Waits (at most 30 s) until every node reports `cluster_state:ok`; `what` names the
    /// wait in the failure.
    pub fn wait_ok(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes.iter().all(RedisServer::cluster_ok) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl RedisServer {
    /// Whether this cluster node reports `cluster_state:ok` (false when it does not answer).
    pub fn cluster_ok(&self) -> bool {
        let info: redis::RedisResult<String> = self
            .try_conn()
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c));
        info.is_ok_and(|i| i.contains("cluster_state:ok"))
    }
}

impl Deref for Cluster {
    type Target = [RedisServer];
    fn deref(&self) -> &[RedisServer] {
        &self.nodes
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }
}

impl<'a> IntoIterator for &'a Cluster {
    type Item = &'a RedisServer;
    type IntoIter = std::slice::Iter<'a, RedisServer>;
    fn into_iter(self) -> Self::IntoIter {
        self.nodes.iter()
    }
}
