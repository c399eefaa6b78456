//! Circuits: per shard and per Cluster primary; failures open them, probes close them.

use super::*;

#[derive(Default)]
pub(super) struct Circuit {
    pub(super) failures: AtomicU32,
    /// Nonzero while open: the shard is skipped (monotonic µs when it opened).
    pub(super) open_until: AtomicU64,
    pub(super) backoff_us: AtomicU64,
    /// the probe task of an open circuit runs
    pub(super) probing: AtomicBool,
}

/// Which circuit a call goes through: its shard's, or in a Redis Cluster the one of the
/// primary that owns the slot of the call's key (circuits follow what fails: one dead
/// primary must not take the other primaries' slots down with it).
#[derive(Clone)]
pub(super) enum Breaker {
    Shard,
    Node(Arc<NodeCircuit>),
}

/// The circuit of one Cluster primary, by address.
pub(super) struct NodeCircuit {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) circuit: Circuit,
}

impl NodeCircuit {
    fn name(&self) -> String {
        format!("cluster/{}:{}", self.host, self.port)
    }
}

/// Which primary owns each slot, from `CLUSTER SLOTS`.
pub(super) struct Topology {
    /// slot → index into `nodes`; `u16::MAX` when no primary owns it
    pub(super) owners: Vec<u16>,
    pub(super) nodes: Vec<Arc<NodeCircuit>>,
}

/// What a Cluster shard knows of its nodes: the slot map (read on connect, again after
/// failures and while a node's circuit is open) and one circuit per primary, kept over
/// refreshes of the map.
pub(super) struct ClusterNodes {
    pub(super) topology: ArcSwapOption<Topology>,
    pub(super) circuits: Mutex<std::collections::HashMap<(String, u16), Arc<NodeCircuit>>>,
    /// monotonic µs of the last refresh
    pub(super) refreshed_at: AtomicU64,
    /// how to connect to a node (the first seed's login and TLS settings)
    pub(super) seed: redis::ConnectionInfo,
    /// the TLS settings of the nodes (`rediss://`)
    pub(super) tls: Option<crate::TlsConfig>,
    /// the configured nodes, where the map is read when no node of it answers
    pub(super) seeds: Vec<super::cluster::Node>,
}

/// Slots, primaries and reply items of a `CLUSTER SLOTS` reply accepted at most (its
/// bytes are untrusted like every reply).
pub(super) const CLUSTER_SLOTS: usize = 16384;

pub(super) const CLUSTER_NODES_MAX: usize = 1000;

impl ClusterNodes {
    /// The slot map of a `CLUSTER SLOTS` reply; `None` when it is malformed.
    pub(super) fn parse(&self, v: &redis::Value) -> Option<Topology> {
        use redis::Value as V;
        let V::Array(ranges) = v else { return None };
        if ranges.len() > CLUSTER_SLOTS {
            return None;
        }
        let text = |v: &V| match v {
            V::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_string),
            V::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let mut owners = vec![u16::MAX; CLUSTER_SLOTS];
        let mut nodes: Vec<Arc<NodeCircuit>> = Vec::new();
        let mut circuits = self.circuits.lock();
        for r in ranges {
            let V::Array(r) = r else { return None };
            let (Some(V::Int(start)), Some(V::Int(end)), Some(V::Array(primary))) =
                (r.first(), r.get(1), r.get(2))
            else {
                return None;
            };
            if !(0..CLUSTER_SLOTS as i64).contains(start)
                || !(*start..CLUSTER_SLOTS as i64).contains(end)
            {
                return None;
            }
            let host = primary.first().and_then(text)?;
            let port = match primary.get(1) {
                Some(V::Int(p)) => u16::try_from(*p).ok().filter(|p| *p != 0)?,
                _ => return None,
            };
            if !super::cluster::plausible_host(&host) {
                continue; // an unknown endpoint: its slots keep the shard's circuit
            }
            let at = match nodes.iter().position(|n| n.host == host && n.port == port) {
                Some(i) => i,
                None => {
                    if nodes.len() >= CLUSTER_NODES_MAX {
                        return None;
                    }
                    if circuits.len() >= 4 * CLUSTER_NODES_MAX {
                        circuits.clear(); // nodes come and go: forget the old ones
                    }
                    let n = circuits
                        .entry((host.clone(), port))
                        .or_insert_with(|| {
                            Arc::new(NodeCircuit {
                                host: host.clone(),
                                port,
                                circuit: Circuit::default(),
                            })
                        })
                        .clone();
                    nodes.push(n);
                    nodes.len() - 1
                }
            };
            for slot in *start..=*end {
                owners[slot as usize] = at as u16;
            }
        }
        Some(Topology { owners, nodes })
    }

    /// The circuit of the primary that owns the slot of `redis_key`, when known.
    fn breaker(&self, redis_key: &str) -> Breaker {
        let Some(t) = self.topology.load_full() else {
            return Breaker::Shard;
        };
        let slot = crate::routing::cluster_slot(redis_key) as usize;
        match t
            .owners
            .get(slot)
            .and_then(|i| t.nodes.get(usize::from(*i)))
        {
            Some(n) => Breaker::Node(Arc::clone(n)),
            None => Breaker::Shard,
        }
    }

    /// True when the map names `n` as the owner of a slot.
    fn owns_slots(&self, n: &NodeCircuit) -> bool {
        self.topology
            .load()
            .as_ref()
            .is_some_and(|t| t.nodes.iter().any(|m| m.host == n.host && m.port == n.port))
    }

    /// How to connect to node `host:port`: the seed's settings at another address.
    fn node_client(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        let addr = match self.seed.addr() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => redis::ConnectionAddr::Tcp(host.to_string(), port),
        };
        redis::Client::open(self.seed.clone().set_addr(addr))
    }

    /// Where node `host:port` is, as a pipe connects to it (the seed's login, and its TLS
    /// settings for `rediss://` nodes); `Err` says why it cannot be reached.
    pub(super) fn target(&self, host: &str, port: u16) -> std::result::Result<Target, String> {
        let client = self.node_client(host, port).map_err(|e| e.to_string())?;
        Target::of(&client, self.tls.as_ref())?
            .ok_or_else(|| format!("cannot connect to Cluster node {host}:{port}"))
    }
}

impl RedisEngine {
    /// The circuit a call on `shard` for Redis key `redis_key` goes through.
    pub(super) fn breaker(&self, redis_key: Option<&str>) -> Breaker {
        match (&self.cluster_nodes, redis_key) {
            (Some(cn), Some(k)) => cn.breaker(k),
            _ => Breaker::Shard,
        }
    }

    /// In a Cluster, the Redis key that picks a command's circuit (see
    /// [`RedisEngine::with_conn_at`]); `None` otherwise.
    pub(super) fn at(&self, redis_key: &str) -> Option<String> {
        self.cluster_nodes.as_ref().map(|_| redis_key.to_string())
    }

    pub(super) fn circuit<'a>(&'a self, shard: usize, b: &'a Breaker) -> &'a Circuit {
        match b {
            Breaker::Shard => &self.circuits[shard],
            Breaker::Node(n) => &n.circuit,
        }
    }

    pub(super) fn breaker_name(&self, shard: usize, b: &Breaker) -> String {
        match b {
            Breaker::Shard => self.shards[shard].name.clone(),
            Breaker::Node(n) => n.name(),
        }
    }

    pub(super) fn gate(&self, shard: usize, b: &Breaker) -> Result<()> {
        if self.circuit(shard, b).open_until.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        Err(Error::Unavailable {
            shard: self.breaker_name(shard, b),
        })
    }

    /// Counts a backend failure of `shard` (through circuit `b`); the last of
    /// [`FAILURES_TO_OPEN`] in a row opens the circuit and starts its probe. (Right after
    /// a probe closed it, one failure is enough: the first calls are the trial.)
    pub(super) fn failed(self: &Arc<Self>, st: &RtState, shard: usize, b: &Breaker, e: &Error) {
        let c = self.circuit(shard, b);
        let n = c.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= FAILURES_TO_OPEN
            && c.open_until
                .compare_exchange(0, mono_us().max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            if c.backoff_us.load(Ordering::Relaxed) == 0 {
                c.backoff_us.store(BACKOFF_MIN_US, Ordering::Relaxed);
            }
            let name = self.breaker_name(shard, b);
            tracing::debug!(shard = %name, error = %e, "shardlimit: circuit opened after {n} consecutive failures");
            // rate-limited per shard (crate::log), on the engine's clock
            self.subscribers.log.note(
                mono_us(),
                crate::log::LogReason::CircuitOpened,
                &name,
                e,
                None,
            );
            self.emit(Event::Circuit {
                shard: name,
                state: CircuitState::Open,
            });
            if !c.probing.swap(true, Ordering::AcqRel) {
                let me = Arc::downgrade(self);
                st.runtime().spawn(RedisEngine::probe(me, shard, b.clone()));
            }
        }
    }

    /// Probes an open circuit until the shard answers: a new connection and a PING after
    /// each back-off (jittered, doubling up to [`BACKOFF_MAX_US`]), so a shard that
    /// answers again is used again within that back-off, whether calls come or not.
    /// The circuit closes half-open: the next failure opens it again at once. Ends when
    /// the limiter is gone. A Cluster node's probe reads the slot map first: once the
    /// node owns no slot (its replica took over), nothing routes to it and it closes.
    pub(super) async fn probe(me: std::sync::Weak<Self>, shard: usize, b: Breaker) {
        loop {
            let backoff = match me.upgrade() {
                Some(e) => e
                    .circuit(shard, &b)
                    .backoff_us
                    .load(Ordering::Relaxed)
                    .clamp(BACKOFF_MIN_US, BACKOFF_MAX_US),
                None => return,
            };
            tokio::time::sleep(Duration::from_micros(jitter(backoff, shard as u64))).await;
            let Some(e) = me.upgrade() else { return };
            let ok = match &b {
                Breaker::Shard => e.ping_new_connection(shard).await,
                Breaker::Node(n) => e.probe_node(n).await,
            };
            let c = e.circuit(shard, &b);
            if !ok {
                c.backoff_us
                    .store((backoff * 2).min(BACKOFF_MAX_US), Ordering::Relaxed);
                tracing::debug!(shard = %e.breaker_name(shard, &b), backoff_ms = backoff / 1000, "shardlimit: probe failed");
                continue;
            }
            if let (Breaker::Shard, Ok(st)) = (&b, e.state()) {
                e.connect_ok(shard);
                // connections idle since before the outage are likely dead: the trial
                // calls must not fail on them
                st.blocking[shard].lock().clear();
                if matches!(e.clients[shard], Client::Single(_)) {
                    st.conns[shard].conn.store(None);
                }
            }
            c.failures.store(FAILURES_TO_OPEN - 1, Ordering::Relaxed);
            // (before closing: a failure right after the close starts a new probe)
            c.probing.store(false, Ordering::Release);
            c.open_until.store(0, Ordering::Release);
            let name = e.breaker_name(shard, &b);
            tracing::info!(shard = %name, "shardlimit: shard answers again, circuit closed");
            e.emit(Event::Circuit {
                shard: name,
                state: CircuitState::Closed,
            });
            return;
        }
    }

    /// One probe of Cluster node `n`: the slot map again, then a PING on a new
    /// connection to the node when it still owns slots.
    pub(super) async fn probe_node(self: &Arc<Self>, n: &NodeCircuit) -> bool {
        let Some(cn) = &self.cluster_nodes else {
            return true;
        };
        if let Ok(st) = self.state() {
            self.refresh_topology(&st).await;
        }
        if !cn.owns_slots(n) {
            return true;
        }
        self.ping_node(&(n.host.clone(), n.port)).await
    }

    /// True when shard `shard` takes a new connection and answers PING within the
    /// timeout. (A new connection: the shard's own may be broken, and a server at
    /// `maxclients` still answers on the connections it has.) A Sentinel shard asks the
    /// Sentinels for the primary first and, when it answers, forgets the connection it
    /// had, so the next call goes to the primary found.
    pub(super) async fn ping_new_connection(self: &Arc<Self>, shard: usize) -> bool {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let ping = |mut c: redis::aio::MultiplexedConnection| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        };
        // a new pipe (TCP, TLS, Unix socket), under its bounds
        let pong = |target: Target| async move {
            let pipe = Pipe::connect(&target, self.timeout, 1).await?;
            let frame = pipe.command(redis::cmd("PING").get_packed_command()).await;
            pipe.close("the probe is done");
            frame
        };
        if let Some(target) = &self.targets[shard] {
            return matches!(
                tokio::time::timeout(self.timeout, pong(target.clone())).await,
                Ok(Ok(frame)) if frame == b"+PONG\r\n"
            );
        }
        if let Some(cn) = &self.cluster_nodes {
            // the map again, and a configured node that answers
            if let Ok(st) = self.state() {
                self.refresh_topology(&st).await;
            }
            for node in cn.seeds.iter().take(3) {
                if self.ping_node(node).await {
                    return true;
                }
            }
            return false;
        }
        if matches!(self.clients[shard], Client::Sentinel(_)) {
            // the primary the Sentinels name now (the resolution has its own timeout)
            let Ok(target) = self.sentinel_target(shard).await else {
                return false;
            };
            let ok = matches!(
                tokio::time::timeout(self.timeout, pong(target)).await,
                Ok(Ok(frame)) if frame == b"+PONG\r\n"
            );
            if ok {
                self.forget_sentinel_pipe(shard);
            }
            return ok;
        }
        let work = async {
            match &self.clients[shard] {
                Client::Single(client) => {
                    let c = client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?;
                    ping(c).await
                }
                // (probed over a pipe above)
                Client::Cluster | Client::Sentinel(_) => {
                    Err(std::io::Error::other("not probed here").into())
                }
            }
        };
        matches!(
            tokio::time::timeout(self.timeout, work).await,
            Ok(Ok(pong)) if pong == "PONG"
        )
    }

    /// Forgets the connection of Sentinel shard `shard`: the next call asks the Sentinels
    /// for the primary again.
    fn forget_sentinel_pipe(&self, shard: usize) {
        if let Some(st) = self.state.load_full() {
            st.conns[shard].conn.store(None);
            if let Some(p) = st.pipes[shard].pipe.swap(None) {
                p.close("the primary may have changed");
            }
        }
    }

    /// True while shard `shard`'s circuit is open.
    pub fn circuit_open(&self, shard: usize) -> bool {
        self.circuits[shard].open_until.load(Ordering::Acquire) != 0
    }
}
