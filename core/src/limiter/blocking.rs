//! The blocking API: calls made on the caller's thread, and the spawner bindings use.

use super::{BlockInfo, Layer};
use super::{Engine, Lease, Limiter, Reservation};
use super::{OverrideInfo, OverridePage};
use crate::decision::Decision;
use crate::engine::CallMode;
use crate::error::{Error, Result};
use crate::policy::{Algorithm, Policy};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Starts futures on a limiter's I/O runtime (from [`Limiter::spawner`]).
#[derive(Clone)]
pub struct Spawner(Arc<crate::engine::redis::RtState>);

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
    /// batches the calls of a burst (see [`Spawner::spawn`]). For the bindings: hidden from
    /// the documentation.
    #[doc(hidden)]
    pub fn spawner(&self) -> Result<Option<Spawner>> {
        match &self.view().engine {
            Engine::Memory(_) => Ok(None),
            Engine::Redis(r) => Ok(Some(Spawner(r.state()?))),
        }
    }

    /// Runs an async call of this limiter to completion on the calling thread. Used by the
    /// blocking API and by bindings without an async runtime (hidden from the
    /// documentation: applications call the `*_blocking` twins). The calling thread waits
    /// at most the configured deadline for Redis.
    #[doc(hidden)]
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
        unleased(policy, "check")?;
        // the in-memory engine never waits: decide right here, no future, no runtime
        if let Some(m) = self.memory_fast(policy) {
            if !policy.0.shadow {
                return self.check_memory_plain(m, key, policy, cost, CallMode::Check);
            }
            return self.check_memory(no_policies(), m, key, policy, cost, CallMode::Check);
        }
        let view = self.inner.view.load();
        if let Engine::Memory(m) = &view.engine {
            return self.check_memory(&view.config, m, key, policy, cost, CallMode::Check);
        }
        drop(view);
        if let Some(r) = self.run_blocking(key, policy, cost, CallMode::Check) {
            return r;
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.check(&key, &policy, cost).await })
    }

    /// Blocking [`Limiter::check_by_name`].
    pub fn check_by_name_blocking(&self, key: &str, policy: &str, cost: u64) -> Result<Decision> {
        let p = self.policy(policy)?;
        self.check_blocking(key, &p, cost)
    }

    /// Blocking [`Limiter::peek`].
    pub fn peek_blocking(&self, key: &str, policy: &Policy) -> Result<Decision> {
        if let Some(r) = self.run_blocking(key, policy, 1, CallMode::Peek) {
            return r;
        }
        let (me, key, policy) = (self.clone(), key.to_string(), policy.clone());
        self.block_on(async move { me.peek(&key, &policy).await })
    }

    /// A handle to the runtime that drives this limiter's Redis connections (created on
    /// first use, re-created after fork). `None` on the in-memory engine. Bindings spawn
    /// their async calls here (hidden from the documentation).
    #[doc(hidden)]
    pub fn runtime_handle(&self) -> Result<Option<tokio::runtime::Handle>> {
        match &self.view().engine {
            Engine::Redis(r) => Ok(Some(r.state()?.runtime().clone())),
            Engine::Memory(_) => Ok(None),
        }
    }
}

/// The blocking twins of async operations that have no fast path of their own: each moves
/// its arguments into a future and runs it with [`Limiter::block_on`]. (`check`, `peek`
/// and `check_by_name` are written out above: they decide on the calling thread when
/// they can.)
macro_rules! blocking_twins {
    ($($(#[$doc:meta])* $twin:ident => $call:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        impl Limiter {
            $(
                $(#[$doc])*
                pub fn $twin(&self, $($arg: $ty),*) -> Result<$ret> {
                    let me = self.clone();
                    $(let $arg = <$ty as Carry>::carry($arg);)*
                    self.block_on(async move { me.$call($(<$ty as Carry>::lend(&$arg)),*).await })
                }
            )*
        }
    };
}

blocking_twins! {
    /// Blocking [`Limiter::connect`].
    connect_blocking => connect(timeout: Duration) -> ();
    /// Blocking [`Limiter::check_all`].
    check_all_blocking => check_all(layers: &[Layer]) -> Decision;
    /// Blocking [`Limiter::acquire`].
    acquire_blocking => acquire(key: &str, policy: &Policy, units: u64) -> (Decision, Option<Lease>);
    /// Blocking [`Limiter::release`].
    release_blocking => release(lease: &Lease) -> bool;
    /// Blocking [`Limiter::release_with`] (a lease of an ad-hoc policy).
    release_with_blocking => release_with(policy: &Policy, lease: &Lease) -> bool;
    /// Blocking [`Limiter::reset`].
    reset_blocking => reset(key: &str, policy: &Policy) -> ();
    /// Blocking [`Limiter::block`].
    block_blocking => block(key: &str, ttl: Option<Duration>, reason: &str) -> ();
    /// Blocking [`Limiter::unblock`].
    unblock_blocking => unblock(key: &str) -> bool;
    /// Blocking [`Limiter::blocked`].
    blocked_blocking => blocked(key: &str) -> Option<BlockInfo>;
    /// Blocking [`Limiter::charge`].
    charge_blocking => charge(key: &str, policy: &Policy, cost: u64) -> Decision;
    /// Blocking [`Limiter::refund`].
    refund_blocking => refund(key: &str, policy: &Policy, cost: u64) -> Decision;
    /// Blocking [`Limiter::reserve`].
    reserve_blocking => reserve(key: &str, policy: &Policy, estimate: u64) -> (Decision, Option<Reservation>);
    /// Blocking [`Limiter::settle`].
    settle_blocking => settle(reservation: &Reservation, actual: u64) -> Decision;
    /// Blocking [`Limiter::settle_with`] (a reservation of an ad-hoc policy).
    settle_with_blocking => settle_with(policy: &Policy, reservation: &Reservation, actual: u64) -> Decision;
    /// Blocking [`Limiter::set_override`].
    set_override_blocking => set_override(key: &str, policy: &str, limit: &str, ttl: Option<Duration>) -> OverrideInfo;
    /// Blocking [`Limiter::get_override`].
    get_override_blocking => get_override(key: &str, policy: &str) -> Option<OverrideInfo>;
    /// Blocking [`Limiter::delete_override`].
    delete_override_blocking => delete_override(key: &str, policy: &str) -> bool;
    /// Blocking [`Limiter::list_overrides`].
    list_overrides_blocking => list_overrides(policy: &str, cursor: Option<&str>, limit: usize) -> OverridePage;
}

impl<'a> Carry<'a> for Option<&'a str> {
    type Owned = Option<String>;
    fn carry(self) -> Option<String> {
        self.map(str::to_owned)
    }
    fn lend(owned: &'a Option<String>) -> Self {
        owned.as_deref()
    }
}

/// An argument of a blocking twin: owned to move into the future, lent back to the call.
trait Carry<'a>: Sized {
    type Owned: Send + 'static;
    fn carry(self) -> Self::Owned;
    fn lend(owned: &'a Self::Owned) -> Self;
}

macro_rules! carry_by_clone {
    ($($borrowed:ty => $owned:ty, $to:expr;)*) => {$(
        impl<'a> Carry<'a> for &'a $borrowed {
            type Owned = $owned;
            fn carry(self) -> $owned {
                $to(self)
            }
            fn lend(owned: &'a $owned) -> Self {
                owned
            }
        }
    )*};
}

carry_by_clone! {
    str => String, str::to_owned;
    [Layer] => Vec<Layer>, <[Layer]>::to_vec;
    Policy => Policy, Policy::clone;
    Lease => Lease, Lease::clone;
    Reservation => Reservation, Reservation::clone;
}

macro_rules! carry_by_copy {
    ($($t:ty),*) => {$(
        impl<'a> Carry<'a> for $t {
            type Owned = $t;
            fn carry(self) -> $t {
                self
            }
            fn lend(owned: &'a $t) -> $t {
                *owned
            }
        }
    )*};
}

carry_by_copy!(u64, usize, Duration, Option<Duration>);

/// A check of a concurrency policy would take units with no lease to give them back: an
/// error that names the operation to use instead.
pub(super) fn unleased(policy: &Policy, op: &str) -> Result<()> {
    if policy.algorithm() == Algorithm::Concurrency {
        return Err(Error::invalid(
            "policy",
            format!(
                "{} is a concurrency policy: {op} takes no lease; use acquire, which returns the lease to release",
                policy.name()
            ),
        ));
    }
    Ok(())
}

/// A config naming no policy: what an in-memory check on [`Limiter::memory_fast`]'s
/// engine checks an ad-hoc policy's name against (that path is taken only when the
/// config in force names none either).
pub(super) fn no_policies() -> &'static crate::config::Config {
    static EMPTY: std::sync::OnceLock<crate::config::Config> = std::sync::OnceLock::new();
    EMPTY.get_or_init(crate::config::Config::default)
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
