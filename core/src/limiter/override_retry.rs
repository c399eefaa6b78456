//! The retry of every call that compares its key's override version in its script call
//! (a check on the async path or the calling thread, a layered check, reserve, charge,
//! refund and settle): the call is made under the override this process knows
//! ([`InForce`]); when the script finds another, nothing was done, and the call is made
//! again under the one found ([`OverrideRetry::learn`]), at most
//! [`MAX_OVERRIDE_TRIES`](super::overrides) times in a row.

use super::overrides::Active;
use super::Limiter;
use crate::engine::outcome::Raw;
use crate::engine::redis::{Checked, LayeredTail, OverrideArg, RedisEngine};
use crate::error::Result;
use crate::policy::Policy;
use std::sync::Arc;

/// A key's override as a call knows it: the override argument its script call sends, and
/// the policy the override makes (`None`: the key's own policy).
pub(super) struct InForce {
    pub(super) ov: OverrideArg,
    pub(super) active: Option<Arc<Active>>,
}

impl InForce {
    /// No override known (or none taken): the key's own policy.
    pub(super) const NONE: InForce = InForce {
        ov: OverrideArg::None,
        active: None,
    };

    /// The tail of a multi-limit script call of `key` under this override (`base`'s
    /// override entry compared first; shadow counting when `shadow`).
    pub(super) fn tail<'a>(&self, base: &'a Policy, key: &'a str, shadow: bool) -> LayeredTail<'a> {
        LayeredTail {
            ov: self.ov,
            policy: &base.0.name,
            key,
            shadow,
            more: &[],
        }
    }

    /// The policy in force for a key of `base`: its override's, which follows `base`'s
    /// scale, else `base` itself.
    #[inline]
    pub(super) fn policy<'a>(&'a self, base: &'a Policy) -> &'a Policy {
        match &self.active {
            Some(a) => {
                a.policy.follow_scale(base);
                &a.policy
            }
            None => base,
        }
    }
}

/// How many times one call found its key's override changed: each finding is learnt
/// ([`OverrideRetry::learn`]) and the call made again, an error past the bound.
#[derive(Default)]
pub(super) struct OverrideRetry {
    tries: usize,
}

impl OverrideRetry {
    /// Whether the call has not been made again yet.
    pub(super) fn first(&self) -> bool {
        self.tries == 0
    }

    /// The override `entry` of `key` under `base` that a script call on shard `shard`
    /// found instead of the one it was sent, learnt (and cached by the process): what the
    /// next try decides with. An error once the override changed too often during one
    /// call ([`Limiter::override_churn`]).
    pub(super) fn learn(
        &mut self,
        l: &Limiter,
        (base, key): (&Policy, &str),
        shard: &str,
        entry: &[u8],
    ) -> Result<InForce> {
        self.tries += 1;
        Limiter::override_churn(self.tries, shard, key)?;
        l.learn_override(base, key, shard, entry)
    }

    /// What one check's script call on shard `shard` answered, on the async path and the
    /// calling thread alike: the outcome to decide from (a failure, or an override that
    /// cannot be learnt, decided by `on_error` as any failed call), or the override the
    /// script found instead, learnt for the next try.
    pub(super) fn answered(
        &mut self,
        l: &Limiter,
        of: (&Policy, &str),
        r: &RedisEngine,
        shard: u32,
        checked: Result<Checked>,
    ) -> Answered {
        match checked {
            Ok(Checked::Override(v)) => {
                match self.learn(l, of, &r.shards[shard as usize].name, &v) {
                    Ok(next) => Answered::Retry(next),
                    Err(e) => Answered::Outcome(Err(e)),
                }
            }
            Ok(Checked::Decided(raw)) => Answered::Outcome(Ok(raw)),
            Err(e) => Answered::Outcome(Err(e)),
        }
    }
}

/// What a check's script call answered ([`OverrideRetry::answered`]).
pub(super) enum Answered {
    /// decide from this (or from `on_error`)
    Outcome(Result<Raw>),
    /// the key's override changed: try again with it
    Retry(InForce),
}
