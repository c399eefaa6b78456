//! A Redis Cluster over the core's own connections: one pipe ([`Pipe`]) per node, made on
//! first use (over TLS when the nodes are `rediss://`), so a Cluster has the same reply
//! bounds and the same rule of when a shard is failing as a standalone shard (see
//! `transport/sansio.rs`): a call queued in this process is never a failure, a node silent
//! for the deadline after the request reached its socket is one.
//!
//! A command goes to the primary that owns its key's slot in the slot map (`CLUSTER
//! SLOTS`, read on first use, again in the background after a `MOVED` or a failure, every
//! byte of it checked: see `circuit.rs`). A `MOVED` reply sends it again to the node it
//! names, an `ASK` reply sends `ASKING` and the command to the node it names, next to each
//! other on that node's connection; at most [`MAX_REDIRECTS`] redirects per command, then
//! it fails as a connection failure (a node that redirects forever is failing).
//! `TRYAGAIN` (a command on several keys of a slot being migrated, some of them moved
//! and some not: a check's state and its absent block entry) is asked again from the map's
//! owner after 2, 4, 8, ... ms, for as long again as the deadline: a migration of a slot's
//! keys usually ends within that, and the node is serving, not failing. A `TRYAGAIN` that
//! outlasts it, and `CLUSTERDOWN`, are connection failures, as every refusal to serve.

use super::*;
use crate::transport::pipe::one_at_a_time;
use crate::transport::resp::MAX_REPLY;
use std::collections::HashMap;
use std::io;

/// Redirects (`MOVED`, `ASK`) one command follows at most. A slot migration needs two (a
/// stale map's owner answers `ASK` or `MOVED`, the new owner serves).
pub(super) const MAX_REDIRECTS: usize = 5;

/// The first pause before a command refused with `TRYAGAIN` is sent again (doubled after
/// each, until the pauses add up to the deadline).
const TRYAGAIN_FIRST_PAUSE: Duration = Duration::from_millis(2);

/// A command on its way through the Cluster ([`RedisEngine::cluster_command`]), boxed as a
/// trait object (the types of callers' futures stay shallow).
pub(super) type Routed<'a> =
    std::pin::Pin<Box<dyn Future<Output = io::Result<(Vec<u8>, Arc<Pipe>)>> + Send + 'a>>;

/// A node's address: host and port.
pub(super) type Node = (String, u16);

/// Where the map is read when no node of it answers: the configured nodes, at most this
/// many of the map's nodes first.
const REFRESH_TRIES: usize = 3;

/// The pipes of one process to the nodes of its Cluster, by address (made again in a forked
/// child, as every connection).
#[derive(Default)]
pub(crate) struct NodePipes {
    pipes: Mutex<HashMap<Node, Arc<PipeSlot>>>,
    /// one read of the slot map at a time
    refresh: tokio::sync::Mutex<()>,
}

/// What an error reply redirects to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Redirect {
    Moved(Node),
    Ask(Node),
}

/// True for a host name as a node may announce it: 1-255 bytes of letters, digits, `.`,
/// `-`, `_` and `:` (an IPv6 address). Anything else is not connected to.
pub(super) fn plausible_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
}

/// The redirect a reply's frame is (`-MOVED <slot> <host>:<port>`, `-ASK ...`), if it is
/// one; `Err` says what is wrong with a malformed one (untrusted bytes). An empty host is
/// `from`'s (a node that does not know its own address).
pub(super) fn redirect(frame: &[u8], from: &Node) -> Option<std::result::Result<Redirect, String>> {
    let ask = if frame.starts_with(b"-MOVED ") {
        false
    } else if frame.starts_with(b"-ASK ") {
        true
    } else {
        return None;
    };
    let what = if ask { "ASK" } else { "MOVED" };
    let bad = || Some(Err(format!("a malformed {what} redirect")));
    let Some(line) = frame
        .strip_suffix(b"\r\n")
        .filter(|l| l.len() <= 300)
        .and_then(|l| std::str::from_utf8(&l[1..]).ok())
    else {
        return bad();
    };
    let mut parts = line.split(' ');
    let (_, Some(slot), Some(endpoint), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad();
    };
    if !slot
        .parse::<u16>()
        .is_ok_and(|s| usize::from(s) < CLUSTER_SLOTS)
    {
        return bad();
    }
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return bad();
    };
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else {
        return bad();
    };
    let host = if host.is_empty() {
        from.0.clone()
    } else if plausible_host(host) {
        host.to_string()
    } else {
        return bad();
    };
    Some(Ok(if ask {
        Redirect::Ask((host, port))
    } else {
        Redirect::Moved((host, port))
    }))
}

/// A handle on the Cluster that the redis crate's commands run on (`query_async`): each
/// command goes to the owner of `slot` (the slot of the key the engine named), redirects
/// followed, its reply framed under our bounds before the redis crate parses it.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    engine: Arc<RedisEngine>,
    st: Arc<RtState>,
    slot: Option<u16>,
}

impl redis::aio::ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let (frame, _) = self
                .engine
                .cluster_command(&self.st, self.slot, cmd.get_packed_command(), MAX_REPLY)
                .await?;
            redis::parse_redis_value(&frame)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(one_at_a_time(self, cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl RedisEngine {
    /// The Cluster connection for a command on Redis key `redis_key` (`None`: any node).
    pub(super) fn cluster_conn(
        self: &Arc<Self>,
        st: &Arc<RtState>,
        redis_key: Option<&str>,
    ) -> ClusterConn {
        ClusterConn {
            engine: Arc::clone(self),
            st: Arc::clone(st),
            slot: redis_key.map(crate::routing::cluster_slot),
        }
    }

    fn nodes(&self) -> io::Result<&ClusterNodes> {
        self.cluster_nodes
            .as_ref()
            .ok_or_else(|| io::Error::other("not a Redis Cluster"))
    }

    /// Sends `packed` (a command on a key of `slot`; `None`: any node will do) to the
    /// primary that owns the slot, follows `MOVED` and `ASK` (at most [`MAX_REDIRECTS`]),
    /// and gives the bytes of the reply (at most `max_reply`) with the connection it came
    /// on.
    pub(super) async fn cluster_command(
        self: &Arc<Self>,
        st: &RtState,
        slot: Option<u16>,
        packed: Vec<u8>,
        max_reply: usize,
    ) -> io::Result<(Vec<u8>, Arc<Pipe>)> {
        let mut node = self.owner(st, slot).await?;
        let mut asking = false;
        let mut redirects = 0;
        let (mut pause, mut paused) = (TRYAGAIN_FIRST_PAUSE, Duration::ZERO);
        while redirects <= MAX_REDIRECTS {
            let pipe = self.node_pipe(st, &node).await?;
            let frame = if asking {
                pipe.command_asking(packed.clone(), max_reply).await?
            } else {
                pipe.command_bounded(packed.clone(), max_reply).await?
            };
            if frame.starts_with(b"-TRYAGAIN") && paused < self.timeout {
                // the slot is being migrated: ask its owner again in a moment (the
                // redirects followed so far do not count against the next attempt)
                tokio::time::sleep(pause).await;
                paused += pause;
                pause *= 2;
                (node, asking, redirects) = (self.owner(st, slot).await?, false, 0);
                continue;
            }
            redirects += 1;
            match redirect(&frame, &node) {
                None => return Ok((frame, pipe)),
                Some(Err(why)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("Redis Cluster node {}:{} sent {why}", node.0, node.1),
                    ))
                }
                Some(Ok(Redirect::Moved(to))) => {
                    // the map is stale: read it again (in the background, at most every
                    // 200 ms), and follow the redirect now
                    self.refresh_topology_soon();
                    (node, asking) = (to, false);
                }
                Some(Ok(Redirect::Ask(to))) => (node, asking) = (to, true),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!(
                "Redis Cluster redirected a command more than {MAX_REDIRECTS} times (last to {}:{})",
                node.0, node.1
            ),
        ))
    }

    /// The node that owns `slot` in the map (read first when none is known yet); when no
    /// owner is known, any node (it redirects).
    async fn owner(self: &Arc<Self>, st: &RtState, slot: Option<u16>) -> io::Result<Node> {
        let cn = self.nodes()?;
        if cn.topology.load().is_none() {
            Box::pin(self.read_topology(st, true)).await;
        }
        if let Some(t) = cn.topology.load_full() {
            let owner = slot
                .and_then(|s| t.owners.get(usize::from(s)))
                .and_then(|i| t.nodes.get(usize::from(*i)))
                .or_else(|| t.nodes.first());
            if let Some(n) = owner {
                return Ok((n.host.clone(), n.port));
            }
        }
        cn.seeds
            .first()
            .cloned()
            .ok_or_else(|| io::Error::other("the Cluster has no nodes"))
    }

    /// The pipe of this process to `node`, made (on the I/O runtime, within the timeout)
    /// when there is none or the last one broke.
    async fn node_pipe(&self, st: &RtState, node: &Node) -> io::Result<Arc<Pipe>> {
        let cn = self.nodes()?;
        let slot = {
            let mut pipes = st.nodes.pipes.lock();
            if !pipes.contains_key(node) && pipes.len() >= 4 * CLUSTER_NODES_MAX {
                // nodes come and go (or a hostile node names many): forget the old ones
                for (_, s) in pipes.drain() {
                    if let Some(p) = s.pipe.swap(None) {
                        p.close("too many Cluster nodes: connections dropped");
                    }
                }
            }
            Arc::clone(pipes.entry(node.clone()).or_default())
        };
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        let _one_at_a_time = slot.connecting.lock().await;
        if let Some(p) = slot.pipe.load_full().filter(|p| !p.is_broken()) {
            return Ok(p);
        }
        let target = cn.target(&node.0, node.1).map_err(io::Error::other)?;
        let (timeout, max_queue) = (self.timeout, self.max_queue());
        let pipe = st
            .runtime()
            .spawn(async move { Pipe::connect(&target, timeout, max_queue).await })
            .await
            .map_err(|e| io::Error::other(format!("connect task failed: {e}")))??;
        let pipe = Arc::new(pipe);
        slot.pipe.store(Some(Arc::clone(&pipe)));
        Ok(pipe)
    }

    /// Reads the slot map (`CLUSTER SLOTS`) from a node of the map or else a configured
    /// node, each asked within the timeout; true when a map was read.
    pub(super) async fn refresh_topology(&self, st: &RtState) -> bool {
        self.read_topology(st, false).await
    }

    /// [`RedisEngine::refresh_topology`]; `if_unknown`: only when no map is known once
    /// this caller's turn comes (another caller may have read it meanwhile).
    async fn read_topology(&self, st: &RtState, if_unknown: bool) -> bool {
        let Some(cn) = &self.cluster_nodes else {
            return false;
        };
        let _one_at_a_time = st.nodes.refresh.lock().await;
        if if_unknown && cn.topology.load().is_some() {
            return true;
        }
        let mut tries: Vec<Node> = Vec::new();
        if let Some(t) = cn.topology.load_full() {
            tries.extend(
                t.nodes
                    .iter()
                    .take(REFRESH_TRIES)
                    .map(|n| (n.host.clone(), n.port)),
            );
        }
        for s in &cn.seeds {
            if !tries.contains(s) {
                tries.push(s.clone());
            }
        }
        let mut read = false;
        for node in tries {
            let ask = async {
                let pipe = self.node_pipe(st, &node).await?;
                let frame = pipe
                    .command(redis::cmd("CLUSTER").arg("SLOTS").get_packed_command())
                    .await?;
                redis::parse_redis_value(&frame).map_err(io::Error::other)
            };
            match tokio::time::timeout(self.timeout, ask).await {
                Ok(Ok(v)) => match cn.parse(&v) {
                    Some(t) => {
                        cn.topology.store(Some(Arc::new(t)));
                        read = true;
                        break;
                    }
                    None => {
                        tracing::warn!(node = %format!("{}:{}", node.0, node.1), "shardlimit: malformed CLUSTER SLOTS reply ignored")
                    }
                },
                Ok(Err(e)) => tracing::debug!(error = %e, "shardlimit: CLUSTER SLOTS failed"),
                Err(_) => tracing::debug!("shardlimit: CLUSTER SLOTS timed out"),
            }
        }
        cn.refreshed_at.store(mono_us(), Ordering::Relaxed);
        read
    }

    /// After a failure or a `MOVED` in a Cluster: reads the slot map again in the
    /// background (at most every 200 ms), so keys of slots that moved (a failover, a
    /// migration) follow their new owner.
    pub(super) fn refresh_topology_soon(self: &Arc<Self>) {
        let Some(cn) = &self.cluster_nodes else {
            return;
        };
        let now = mono_us();
        let last = cn.refreshed_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 200_000
            || cn
                .refreshed_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let Ok(st) = self.state() else { return };
        let me = Arc::clone(self);
        st.runtime().spawn(async move {
            if let Ok(st) = me.state() {
                me.refresh_topology(&st).await;
            }
        });
    }

    /// Loads every script on every primary of the slot map (read first when none is
    /// known; the first configured node when none can be read), so that the first checks
    /// on each node find their scripts (a Cluster's `connect`).
    pub(super) async fn cluster_warm_up(self: &Arc<Self>, st: &RtState) -> io::Result<()> {
        let cn = self.nodes()?;
        self.read_topology(st, true).await;
        let nodes: Vec<Node> = match cn.topology.load_full() {
            Some(t) if !t.nodes.is_empty() => {
                t.nodes.iter().map(|n| (n.host.clone(), n.port)).collect()
            }
            _ => cn.seeds.iter().take(1).cloned().collect(),
        };
        for node in nodes {
            let pipe = self.node_pipe(st, &node).await?;
            for (_, src, _) in scripts::all() {
                let load = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(src)
                    .get_packed_command();
                let frame = pipe.command_bounded(load, 1024).await?;
                if !frame.starts_with(b"$40\r\n") {
                    // (untrusted bytes: a short, lossy excerpt)
                    let what = String::from_utf8_lossy(&frame[..frame.len().min(200)]);
                    return Err(io::Error::other(format!(
                        "SCRIPT LOAD on Cluster node {}:{} failed: {}",
                        node.0,
                        node.1,
                        what.trim_end()
                    )));
                }
            }
        }
        Ok(())
    }

    /// True when `node` takes a new connection and answers PING within the timeout.
    pub(super) async fn ping_node(&self, node: &Node) -> bool {
        let Some(cn) = &self.cluster_nodes else {
            return false;
        };
        let Ok(target) = cn.target(&node.0, node.1) else {
            return false;
        };
        let pong = async {
            let pipe = Pipe::connect(&target, self.timeout, 1).await?;
            let frame = pipe.command(redis::cmd("PING").get_packed_command()).await;
            pipe.close("the probe is done");
            frame
        };
        matches!(
            tokio::time::timeout(self.timeout, pong).await,
            Ok(Ok(frame)) if frame == b"+PONG\r\n"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(h: &str, p: u16) -> Node {
        (h.to_string(), p)
    }

    #[test]
    fn redirects_are_read_and_checked() {
        let from = node("10.0.0.1", 7000);
        assert_eq!(
            redirect(b"-MOVED 3999 127.0.0.1:6381\r\n", &from),
            Some(Ok(Redirect::Moved(node("127.0.0.1", 6381))))
        );
        assert_eq!(
            redirect(b"-ASK 16383 redis-2.internal:7001\r\n", &from),
            Some(Ok(Redirect::Ask(node("redis-2.internal", 7001))))
        );
        // an empty host is the sender's own
        assert_eq!(
            redirect(b"-MOVED 1 :7002\r\n", &from),
            Some(Ok(Redirect::Moved(node("10.0.0.1", 7002))))
        );
        assert_eq!(
            redirect(b"-MOVED 1 ::1:7002\r\n", &from),
            Some(Ok(Redirect::Moved(node("::1", 7002))))
        );
        assert_eq!(redirect(b"-ERR MOVED 1 a:1\r\n", &from), None);
        assert_eq!(redirect(b"+OK\r\n", &from), None);
        for bad in [
            &b"-MOVED 16384 a:1\r\n"[..],
            b"-MOVED x a:1\r\n",
            b"-MOVED 1 a:0\r\n",
            b"-MOVED 1 a:65536\r\n",
            b"-MOVED 1 a\r\n",
            b"-MOVED 1 a:1 extra\r\n",
            b"-MOVED 1\r\n",
            b"-MOVED 1 a b:1\r\n",
            b"-MOVED 1 a/b:1\r\n",
            b"-MOVED 1 \xff:1\r\n",
            b"-MOVED 1 a:1",
        ] {
            assert!(
                matches!(redirect(bad, &from), Some(Err(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("-MOVED 1 {}:1\r\n", "a".repeat(256));
        assert!(matches!(redirect(long.as_bytes(), &from), Some(Err(_))));
    }
}
