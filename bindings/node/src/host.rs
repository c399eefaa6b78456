//! The host transport: the core's sans-I/O check path (`shardlimit::HostChecks`)
//! with the bytes moved by `host.js` on Node's own event loop, one `net.Socket` per shard.
//! A check creates its Promise here and it is settled here, on the JS thread, by the call
//! that hands in the bytes of its reply: no I/O thread, no threadsafe function.

use super::*;
use std::collections::HashMap;

/// The state machines of one limiter's shards; `host.js` owns the sockets.
#[napi]
pub struct NativeHostChecks {
    limiter: shardlimit::Limiter,
    inner: shardlimit::HostChecks,
    /// the Promise of each check in flight, by id
    waiting: HashMap<u64, sys::napi_deferred>,
}

#[napi(object)]
pub struct HostAddress {
    pub host: String,
    pub port: u32,
}

impl NativeHostChecks {
    /// Settles the Promises of `done` (their ids came from `check`).
    fn settle(&mut self, env: &Env, done: Vec<(u64, shardlimit::Result<shardlimit::Decision>)>) {
        let raw_env = env.raw();
        for (id, r) in done {
            let Some(deferred) = self.waiting.remove(&id) else {
                continue;
            };
            // SAFETY: JS thread, its env; each deferred is settled once (removed above).
            unsafe {
                match r.map_err(|e| core_error(env, e)).and_then(|d| {
                    <super::Decision as ToNapiValue>::to_napi_value(
                        raw_env,
                        super::Decision { inner: d },
                    )
                }) {
                    Ok(v) => {
                        sys::napi_resolve_deferred(raw_env, deferred, v);
                    }
                    Err(e) => {
                        let err = JsError::from(e).into_value(raw_env);
                        sys::napi_reject_deferred(raw_env, deferred, err);
                    }
                }
            }
        }
    }
}

fn shard_index(shard: u32) -> usize {
    shard as usize
}

#[napi]
impl NativeHostChecks {
    /// The host transport of `limiter`: a `config` error unless every shard is a
    /// standalone Redis over plain TCP.
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, limiter: &NativeLimiter) -> Result<Self> {
        guarded(|| shardlimit::HostChecks::new(&limiter.inner))
            .map(|inner| NativeHostChecks {
                limiter: limiter.inner.clone(),
                inner,
                waiting: HashMap::new(),
            })
            .map_err(|e| core_error(&env, e))
    }

    #[napi(getter)]
    pub fn shard_count(&self) -> u32 {
        self.inner.shard_count() as u32
    }

    /// The config's `timeout`, in milliseconds (how long a connect may take).
    #[napi(getter)]
    pub fn timeout_ms(&self) -> f64 {
        ms(self.inner.timeout())
    }

    #[napi(catch_unwind)]
    pub fn address(&self, env: Env, shard: u32) -> Result<HostAddress> {
        self.inner
            .address(shard_index(shard))
            .map(|(host, port)| HostAddress {
                host,
                port: port.into(),
            })
            .map_err(|e| core_error(&env, e))
    }

    /// A check of the config's policy `policy`: its Promise, or null when the check needs
    /// the limiter's own path (multi-limit, shadow, local admission, overrides, a reshard
    /// handoff): then `host.js` calls the default `check`.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision> | null")]
    pub fn check(
        &mut self,
        env: Env,
        key: String,
        policy: String,
        cost: f64,
    ) -> Result<Option<Unknown<'static>>> {
        let step = units("cost", cost).and_then(|cost| {
            let p = self.limiter.policy(&policy)?;
            guarded(|| self.inner.check(&key, &p, cost))
        });
        match step {
            Ok(shardlimit::HostStep::Pending { id, .. }) => {
                let mut deferred = std::ptr::null_mut();
                let mut promise = std::ptr::null_mut();
                // SAFETY: JS thread, its env.
                unsafe {
                    check_status!(sys::napi_create_promise(
                        env.raw(),
                        &mut deferred,
                        &mut promise
                    ))?;
                    self.waiting.insert(id, deferred);
                    Ok(Some(Unknown::from_raw_unchecked(env.raw(), promise)))
                }
            }
            Ok(shardlimit::HostStep::Decided(d)) => {
                settled(&env, Ok(super::Decision { inner: d })).map(Some)
            }
            Ok(shardlimit::HostStep::Delegate) => Ok(None),
            Err(e) => settled::<super::Decision>(&env, Err(core_error(&env, e))).map(Some),
        }
    }

    /// How many checks wait for their reply.
    #[napi(getter)]
    pub fn in_flight(&self) -> u32 {
        self.inner.in_flight() as u32
    }

    /// How many bytes the socket `fd` holds unread (FIONREAD); 0 when it cannot say.
    /// `host.js` asks before a deadline: a shard whose socket holds bytes is not silent.
    #[napi]
    pub fn unread(&self, fd: i32) -> u32 {
        #[cfg(unix)]
        {
            let mut n: libc::c_int = 0;
            // SAFETY: FIONREAD writes one c_int; a bad fd is an error, not UB.
            let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
            if rc == 0 && n > 0 {
                return n as u32;
            }
        }
        #[cfg(not(unix))]
        let _ = fd;
        0
    }

    /// A shard a check found down with its circuit closed, or null: `host.js` connects it
    /// now instead of waiting out its reconnect back-off (the check waits for that connect).
    #[napi(getter)]
    pub fn wanted_connect(&self) -> Option<u32> {
        self.inner.wanted_connect().map(|s| s as u32)
    }

    /// The socket of shard `shard` starts to connect.
    #[napi(catch_unwind)]
    pub fn connecting(&mut self, env: Env, shard: u32) -> Result<()> {
        self.inner
            .connecting(shard_index(shard))
            .map_err(|e| core_error(&env, e))
    }

    /// The socket of shard `shard` is open.
    #[napi(catch_unwind)]
    pub fn connected(&mut self, env: Env, shard: u32) -> Result<()> {
        self.inner
            .connected(shard_index(shard))
            .map_err(|e| core_error(&env, e))
    }

    /// The bytes to write to shard `shard` now, or null: a copy in a JS-owned Buffer (a
    /// few hundred bytes per check: cheaper than an external buffer and its finalizer),
    /// whose source goes back to the machine for the next hand-out.
    #[napi(catch_unwind, ts_return_type = "Buffer | null")]
    pub fn transmit(&mut self, env: Env, shard: u32) -> Result<Option<Unknown<'static>>> {
        let shard = shard_index(shard);
        let Some(bytes) = self.inner.poll_transmit(shard) else {
            return Ok(None);
        };
        let mut data = std::ptr::null_mut();
        let mut out = std::ptr::null_mut();
        // SAFETY: JS thread, its env; napi copies `bytes.len()` bytes from `bytes`.
        let made = unsafe {
            check_status!(sys::napi_create_buffer_copy(
                env.raw(),
                bytes.len(),
                bytes.as_ptr().cast(),
                &mut data,
                &mut out
            ))
        };
        self.inner.recycle(shard, bytes);
        made?;
        // SAFETY: a value napi made just now in this env.
        Ok(Some(unsafe { Unknown::from_raw_unchecked(env.raw(), out) }))
    }

    /// The first `len` bytes of `data` were read from shard `shard` (`host.js` reads into
    /// one buffer it reuses): settles the checks they answer. Returns bits: 1 when the
    /// socket must be closed (the bytes could not be trusted: every check on it failed),
    /// 2 when the machine has bytes to write (the log-in's end released waiting checks,
    /// or NOSCRIPT sends one again).
    #[napi(catch_unwind)]
    pub fn on_data(&mut self, env: Env, shard: u32, data: &[u8], len: u32) -> u32 {
        let data = &data[..(len as usize).min(data.len())];
        let shard = shard_index(shard);
        let done = self.inner.handle_input(shard, data);
        self.settle(&env, done);
        if self.inner.is_down(shard) {
            1
        } else if self.inner.wants_transmit(shard) {
            2
        } else {
            0
        }
    }

    /// Shard `shard`'s socket closed or failed (`why`): its checks fail (and follow
    /// their policies' `on_error`).
    #[napi(catch_unwind)]
    pub fn on_closed(&mut self, env: Env, shard: u32, why: String) {
        let done = self.inner.handle_closed(shard_index(shard), &why);
        self.settle(&env, done);
    }

    /// True when shard `shard`'s socket must be closed and made again.
    #[napi(catch_unwind)]
    pub fn is_down(&self, shard: u32) -> bool {
        self.inner.is_down(shard_index(shard))
    }

    /// Settles the checks whose deadline passed. Returns the milliseconds until the next
    /// deadline, or null when nothing waits.
    #[napi(catch_unwind)]
    pub fn on_timer(&mut self, env: Env) -> Option<f64> {
        let done = self.inner.handle_timeout(std::time::Instant::now());
        self.settle(&env, done);
        self.next_deadline_ms()
    }

    /// Milliseconds until the next deadline (0 when due), or null when nothing waits.
    #[napi]
    pub fn next_deadline_ms(&self) -> Option<f64> {
        self.inner
            .next_deadline()
            .map(|d| ms(d.saturating_duration_since(std::time::Instant::now())))
    }
}
