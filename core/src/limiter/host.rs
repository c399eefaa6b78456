//! Checks whose bytes the host moves on its own event loop (Node's `net.Socket` on
//! libuv, Python's asyncio, Go's netpoller): no I/O thread, no thread hop per decision. [`HostChecks`] owns one
//! sans-I/O connection per shard (`transport/sansio.rs`) and turns each completion into a
//! [`Decision`] through the code every Redis check goes through (the engine's reply
//! checks, circuit and latency accounting, then `on_error`, metrics and events).
//!
//! Only the plain check of one policy goes this way; what needs more (multi-limit, shadow,
//! local admission, overrides, a reshard handoff) is [`HostStep::Delegate`]d to
//! [`Limiter::check`]. Standalone plain-TCP shards only: [`HostChecks::new`] refuses a
//! Cluster, TLS, Sentinel or Unix-socket shard.

use super::blocking::unleased;
use super::check::Plan;
use super::{Engine, Limiter};
use crate::decision::Decision;
use crate::engine::redis::{Checked, Mode, RedisEngine};
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::policy::{Compiled, Policy};
use crate::transport::sansio::{Completion, SansIo};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What became of a check handed to [`HostChecks::check`].
#[derive(Debug)]
pub enum HostStep {
    /// decided without Redis (the block cache, an open circuit's `on_error`)
    Decided(Decision),
    /// sent (or queued) on shard `shard`'s connection: its decision comes back with `id`
    Pending { id: u64, shard: usize },
    /// this check needs the limiter's own path: call [`Limiter::check`]
    Delegate,
}

/// A check in flight.
struct Pending {
    policy: Policy,
    eff: Compiled,
    key: String,
    cost: u64,
    shard: u32,
    start: Instant,
}

/// The checks of one limiter whose bytes the host moves: one connection state machine
/// per shard, driven by the host's calls (see `transport/sansio.rs` for the order).
pub struct HostChecks {
    limiter: Limiter,
    engine: Arc<RedisEngine>,
    conns: Vec<SansIo>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    done: Vec<Completion>,
    /// shards whose connect a check started (see [`HostChecks::wants_connect`])
    wanted: Vec<bool>,
}

impl std::fmt::Debug for HostChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostChecks")
            .field("shards", &self.conns.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl HostChecks {
    /// The host transport of `limiter`, whose shards must all be standalone Redis servers
    /// over plain TCP (a `config` error names the first that is not).
    pub fn new(limiter: &Limiter) -> Result<HostChecks> {
        let engine = match &limiter.view().engine {
            Engine::Redis(r) => Arc::clone(r),
            Engine::Memory(_) => {
                return Err(Error::config(
                    "shards",
                    "the host transport needs Redis shards; this limiter decides in memory",
                ))
            }
        };
        let conns = (0..engine.shards.len())
            .map(|i| {
                let handshake = engine.host_target(i)?.handshake();
                Ok(SansIo::new(handshake, engine.timeout, engine.max_queue()))
            })
            .collect::<Result<Vec<_>>>()?;
        let wanted = vec![false; conns.len()];
        Ok(HostChecks {
            limiter: limiter.clone(),
            engine,
            conns,
            pending: HashMap::new(),
            next_id: 1,
            done: Vec::new(),
            wanted,
        })
    }

    /// How many shards (connections) there are.
    pub fn shard_count(&self) -> usize {
        self.conns.len()
    }

    /// Where shard `shard` listens: host and port.
    pub fn address(&self, shard: usize) -> Result<(String, u16)> {
        self.shard_ok(shard)?;
        let t = self.engine.host_target(shard)?;
        let (h, p) = t.tcp().expect("host_target is TCP");
        Ok((h.to_string(), p))
    }

    /// The config's `timeout`: how long a connect (and log-in) may take.
    pub fn timeout(&self) -> std::time::Duration {
        self.engine.timeout
    }

    fn shard_ok(&self, shard: usize) -> Result<()> {
        if shard < self.conns.len() {
            Ok(())
        } else {
            Err(Error::invalid(
                "shard",
                format!("is {shard}; there are {} shards", self.conns.len()),
            ))
        }
    }

    /// Checks `cost` units of `policy` for `key` (the contract of [`Limiter::check`]).
    pub fn check(&mut self, key: &str, policy: &Policy, cost: u64) -> Result<HostStep> {
        unleased(policy, "check")?;
        let view = self.limiter.view();
        let r = match &view.engine {
            // a reload made another engine: the limiter's own path has it
            Engine::Redis(r) if Arc::ptr_eq(r, &self.engine) => r,
            _ => return Ok(HostStep::Delegate),
        };
        let p = &*policy.0;
        if p.parts.is_some()
            || p.shadow
            || p.local_admission.is_some()
            || p.overrides
            || view.handoff.is_some()
        {
            return Ok(HostStep::Delegate);
        }
        let (eff, cost, shard) = match self.limiter.plan(r, key, policy, cost)? {
            Plan::Decided(d) => return Ok(HostStep::Decided(d)),
            Plan::Redis { eff, cost, shard } => (eff, cost, shard),
        };
        let finish =
            |l: &Limiter, raw| l.after_script(p, &eff, key, cost, CallMode::Check, shard, raw);
        if let Err(e) = r.host_gate(shard as usize) {
            return finish(&self.limiter, Err(e)).map(HostStep::Decided);
        }
        let req = self.limiter.request(p, &eff, key, cost, Mode::Check, None);
        let call = r.host_call(&req);
        let id = self.next_id;
        self.next_id += 1;
        let start = Instant::now();
        let conn = &mut self.conns[shard as usize];
        if conn.is_down() {
            // The circuit lets checks through and the host is waiting out its reconnect
            // back-off: the check waits for a connect made now (the host sees
            // `wants_connect`) instead of failing. A shard that answers again after an
            // outage is used as soon as its circuit's probe closes the circuit, not a
            // back-off later; one that still refuses fails the check at once.
            conn.connecting(start);
            self.wanted[shard as usize] = true;
        }
        if let Err(e) = conn.submit(id, call) {
            let raw = r
                .host_finish(shard as usize, start, Err(e), eff.limit, cost)
                .and_then(|c| decided(&r.shards[shard as usize].name, c));
            return finish(&self.limiter, raw).map(HostStep::Decided);
        }
        self.pending.insert(
            id,
            Pending {
                policy: policy.clone(),
                eff,
                key: key.to_string(),
                cost,
                shard,
                start,
            },
        );
        Ok(HostStep::Pending {
            id,
            shard: shard as usize,
        })
    }

    /// The host starts to connect to shard `shard` (a connect and log-in that is not done
    /// within the config's `timeout` fails). Called again before the socket is open (the
    /// host's connect only starts then), the connect's clock starts again.
    pub fn connecting(&mut self, shard: usize) -> Result<()> {
        self.shard_ok(shard)?;
        self.wanted[shard] = false;
        self.conns[shard].connecting(Instant::now());
        Ok(())
    }

    /// True when a check found shard `shard` down with its circuit closed and now waits
    /// for a connect: the host connects at once (cutting its reconnect back-off short)
    /// and calls [`HostChecks::connecting`], which clears it.
    pub fn wants_connect(&self, shard: usize) -> bool {
        self.wanted.get(shard).copied().unwrap_or(false)
    }

    /// The first shard that [`HostChecks::wants_connect`], if any.
    pub fn wanted_connect(&self) -> Option<usize> {
        self.wanted.iter().position(|w| *w)
    }

    /// The host's socket to shard `shard` is open.
    pub fn connected(&mut self, shard: usize) -> Result<()> {
        self.shard_ok(shard)?;
        self.conns[shard].connected();
        Ok(())
    }

    /// True when shard `shard`'s connection is closed or must be: the host closes its
    /// socket and connects again.
    pub fn is_down(&self, shard: usize) -> bool {
        self.conns.get(shard).is_none_or(SansIo::is_down)
    }

    /// The bytes to write to shard `shard` now, if any.
    pub fn poll_transmit(&mut self, shard: usize) -> Option<Vec<u8>> {
        self.conns.get_mut(shard)?.poll_transmit(Instant::now())
    }

    /// True when [`HostChecks::poll_transmit`] has bytes for shard `shard` (after an input
    /// that completed the log-in while checks waited, or sends a check again on NOSCRIPT).
    pub fn wants_transmit(&self, shard: usize) -> bool {
        self.conns.get(shard).is_some_and(SansIo::wants_transmit)
    }

    /// Gives back a buffer of [`HostChecks::poll_transmit`] once its bytes are copied or
    /// written, for the next hand-out to reuse. Optional.
    pub fn recycle(&mut self, shard: usize, buf: Vec<u8>) {
        if let Some(c) = self.conns.get_mut(shard) {
            c.recycle(buf);
        }
    }

    /// Bytes read from shard `shard`: the decisions they complete, by id.
    pub fn handle_input(&mut self, shard: usize, bytes: &[u8]) -> Vec<(u64, Result<Decision>)> {
        let mut done = std::mem::take(&mut self.done);
        if let Some(c) = self.conns.get_mut(shard) {
            c.handle_input(Instant::now(), bytes, &mut done);
        }
        self.decide(done)
    }

    /// Shard `shard`'s socket closed or failed (`why`): every call on it fails (and
    /// follows its policy's `on_error`).
    pub fn handle_closed(&mut self, shard: usize, why: &str) -> Vec<(u64, Result<Decision>)> {
        let mut done = std::mem::take(&mut self.done);
        if let Some(c) = self.conns.get_mut(shard) {
            c.handle_closed(why, &mut done);
        }
        self.decide(done)
    }

    /// Time is `now`: the connects that took longer than the timeout, and the calls on a
    /// shard silent for the timeout, fail. Hand over every byte the sockets already hold
    /// first ([`HostChecks::handle_input`]): see `transport/sansio.rs`.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<(u64, Result<Decision>)> {
        let mut done = std::mem::take(&mut self.done);
        for c in &mut self.conns {
            c.handle_timeout(now, &mut done);
        }
        self.decide(done)
    }

    /// When [`HostChecks::handle_timeout`] is due next, if anything waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.conns.iter().filter_map(SansIo::next_deadline).min()
    }

    /// How many checks wait for their decision.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn decide(&mut self, mut done: Vec<Completion>) -> Vec<(u64, Result<Decision>)> {
        let mut out = Vec::with_capacity(done.len());
        for c in done.drain(..) {
            let Some(p) = self.pending.remove(&c.id) else {
                continue;
            };
            let shard = p.shard as usize;
            let raw = self
                .engine
                .host_finish(shard, p.start, c.reply, p.eff.limit, p.cost)
                .and_then(|c| decided(&self.engine.shards[shard].name, c));
            let policy = &*p.policy.0;
            let d = self.limiter.after_script(
                policy,
                &p.eff,
                &p.key,
                p.cost,
                CallMode::Check,
                p.shard,
                raw,
            );
            out.push((c.id, d));
        }
        self.done = done;
        out
    }
}

/// A plain check's reply: a decision. (An override entry is an answer only to a check of
/// a policy that takes overrides, which never comes this way.)
fn decided(shard: &str, c: Checked) -> Result<crate::engine::outcome::Raw> {
    match c {
        Checked::Decided(raw) => Ok(raw),
        Checked::Override(_) => Err(Error::Script {
            shard: shard.to_string(),
            message: "a check of a policy without overrides got an override entry".into(),
        }),
    }
}
