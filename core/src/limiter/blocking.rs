//! The blocking API: calls made on the caller's thread, and the spawner bindings use.

use super::{BlockInfo, Layer};
use super::{Engine, Lease, Limiter};
use crate::decision::Decision;
use crate::error::{Error, Result};
use crate::policy::{Algorithm, Policy};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Starts futures on a limiter's I/O runtime (from [`Limiter::spawner`]).
#[derive(Clone)]
pub struct Spawner(Arc<crate::transport::runtime::RtState>);

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spawner")
    }
}

impl Spawner {
    /// Starts `fut` on the I/O runtime, from any thread. Futures spawned while earlier ones
    /// wait to start are started together, so the Redis commands of a burst of calls from
    /// an event loop leave in one write, and the I/O thread wakes once for them.
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.0.submit(Box::pin(fut));
    }
}

impl Limiter {
    /// Where bindings run async calls: `None` on the in-memory engine (its calls never
    /// wait: run them inline), else a [`Spawner`] onto this limiter's I/O runtime that
    /// batches the calls of a burst (see [`Spawner::spawn`]).
    pub fn spawner(&self) -> Result<Option<Spawner>> {
        match &self.view().engine {
            Engine::Memory(_) => Ok(None),
            Engine::Redis(r) => Ok(Some(Spawner(r.state()?))),
        }
    }

    /// Runs an async call of this limiter to completion on the calling thread. Used by the
    /// blocking API and by bindings without an async runtime. The calling thread waits at
    /// most the configured deadline for Redis.
    pub fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        match &self.view().engine {
            // memory futures never wait: poll once on a trivial executor
            Engine::Memory(_) => poll_once(fut),
            Engine::Redis(r) => {
                let st = r.state()?;
                if tokio::runtime::Handle::try_current().is_ok() {
                    // inside someone's runtime, block_on would panic: run on ours and wait
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    st.runtime().spawn(async move {
                        let _ = tx.send(fut.await);
                    });
                    rx.recv()
                        .map_err(|_| Error::Internal("the I/O runtime stopped".into()))?
                } else {
                    st.runtime().block_on(fut)
                }
            }
        }
    }

    /// Blocking [`Limiter::check`].
    pub fn check_blocking(&self, key: &str, policy: &Policy, cost: u64) -> Result<Decision> {
        if policy.algorithm() != Algorithm::Concurrency {
            // the in-memory engine never waits: decide right here, no future, no runtime
            let view = self.inner.view.load();
            if let Engine::Memory(m) = &view.engine {
                return self.check_memory(m, key, policy, cost, false, "");
            }
        }
        if policy.algorithm() != Algorithm::Concurrency {
            if let Some(r) = self.run_blocking(key, policy, cost, false) {
                return r;
            }
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.check(&key, &policy, cost).await })
    }

    /// Blocking [`Limiter::check_named`].
    pub fn check_named_blocking(&self, policy: &str, key: &str, cost: u64) -> Result<Decision> {
        let p = self.policy(policy)?;
        self.check_blocking(key, &p, cost)
    }

    /// Blocking [`Limiter::check_all`].
    pub fn check_all_blocking(&self, layers: &[Layer]) -> Result<Decision> {
        let (me, layers) = (self.clone(), layers.to_vec());
        self.block_on(async move { me.check_all(&layers).await })
    }

    /// Blocking [`Limiter::peek`].
    pub fn peek_blocking(&self, key: &str, policy: &Policy) -> Result<Decision> {
        if let Some(r) = self.run_blocking(key, policy, 1, true) {
            return r;
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.peek(&key, &policy).await })
    }

    /// Blocking [`Limiter::acquire`].
    pub fn acquire_blocking(
        &self,
        key: &str,
        policy: &Policy,
        units: u64,
    ) -> Result<(Decision, Option<Lease>)> {
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.acquire(&key, &policy, units).await })
    }

    /// Blocking [`Limiter::release`].
    pub fn release_blocking(&self, lease: &Lease) -> Result<bool> {
        let (me, lease) = (self.clone(), lease.clone());
        self.block_on(async move { me.release(&lease).await })
    }

    /// Blocking [`Limiter::release_with`].
    pub fn release_with_blocking(&self, policy: &Policy, lease: &Lease) -> Result<bool> {
        let (me, policy, lease) = (self.clone(), policy.clone(), lease.clone());
        self.block_on(async move { me.release_with(&policy, &lease).await })
    }

    /// Blocking [`Limiter::reset`].
    pub fn reset_blocking(&self, key: &str, policy: &Policy) -> Result<()> {
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.reset(&key, &policy).await })
    }

    /// Blocking [`Limiter::block`].
    pub fn block_blocking(&self, key: &str, ttl: Option<Duration>, reason: &str) -> Result<()> {
        let (me, key, reason) = (self.clone(), key.to_string(), reason.to_string());
        self.block_on(async move { me.block(&key, ttl, &reason).await })
    }

    /// Blocking [`Limiter::unblock`].
    pub fn unblock_blocking(&self, key: &str) -> Result<bool> {
        let (me, key) = (self.clone(), key.to_string());
        self.block_on(async move { me.unblock(&key).await })
    }

    /// Blocking [`Limiter::blocked`].
    pub fn blocked_blocking(&self, key: &str) -> Result<Option<BlockInfo>> {
        let (me, key) = (self.clone(), key.to_string());
        self.block_on(async move { me.blocked(&key).await })
    }

    /// A handle to the runtime that drives this limiter's Redis connections (created on
    /// first use, re-created after fork). `None` on the in-memory engine. Bindings spawn
    /// their async calls here.
    pub fn runtime_handle(&self) -> Result<Option<tokio::runtime::Handle>> {
        match &self.view().engine {
            Engine::Redis(r) => Ok(Some(r.state()?.runtime().clone())),
            Engine::Memory(_) => Ok(None),
        }
    }
}

/// Polls a future that is known never to wait (memory engine) to completion.
pub(super) fn poll_once<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    use std::task::{Context, Poll, Waker};
    // unconstrained: inside a tokio task the checks' cooperative budget could run out
    // (Limiter::run), and a future polled once must not be asked to yield
    let mut fut = std::pin::pin!(tokio::task::unconstrained(fut));
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => Err(Error::Internal("in-memory call did not complete".into())),
    }
}
