//! Layered checks of policies that take per-key overrides: each such layer is decided
//! under its key's override (an override of several limits expands to them, as a
//! multi-limit policy's check does). On Redis the override versions the client decided
//! with are compared in the same script call as the layers of their shard (or slot); a
//! newer override found there is learnt and the whole check made again (bounded, see
//! [`Limiter::override_churn`]), what other shards admitted meanwhile given back.

use super::layered::{Layered, OverrideCheck};
use super::override_retry::{InForce, OverrideRetry};
use super::{Engine, Layer, Limiter};
use crate::decision::Decision;
use crate::engine::redis::OverrideArg;
use crate::error::Result;

impl Limiter {
    /// [`Limiter::check_all_enforced`] of layers some of whose policies take overrides.
    pub(super) async fn check_all_overridden(&self, layers: &[Layer]) -> Result<Decision> {
        let memory = matches!(self.view().engine, Engine::Memory(_));
        // per caller layer: the override version sent (Redis) and the override in force
        let mut ovs: Vec<InForce> = layers
            .iter()
            .map(|l| {
                if memory {
                    let a = self.memory_override(&l.policy.0, &l.key, self.now());
                    InForce {
                        ov: OverrideArg::Off,
                        active: a.map(|(a, _)| a),
                    }
                } else {
                    self.override_arg(&l.policy.0, &l.key)
                }
            })
            .collect();
        let mut retry = OverrideRetry::default();
        loop {
            let in_force: Vec<Layer> = layers
                .iter()
                .zip(&ovs)
                .map(|(l, f)| match f.active {
                    Some(_) => Layer::new(l.key.clone(), f.policy(&l.policy), l.cost),
                    None => l.clone(),
                })
                .collect();
            let (expanded, origin) = super::multi::expand(&in_force)?;
            let checks: Vec<OverrideCheck<'_>> = if memory {
                Vec::new()
            } else {
                layers
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.policy.0.overrides)
                    .map(|(j, l)| OverrideCheck {
                        at: origin.iter().position(|o| o.0 == j).unwrap_or(0),
                        ov: ovs[j].ov,
                        policy: &l.policy.0.name,
                        key: &l.key,
                    })
                    .collect()
            };
            match self
                .layered(&expanded, &origin, layers, false, None, &checks)
                .await?
            {
                Layered::Overridden {
                    check,
                    shard,
                    entry,
                } => {
                    let j = origin[checks[check].at].0;
                    let name = match &self.view().engine {
                        Engine::Redis(r) => r.shards[shard as usize].name.clone(),
                        Engine::Memory(_) => String::new(),
                    };
                    let l = &layers[j];
                    ovs[j] = retry.learn(self, (&l.policy, &l.key), &name, &entry)?;
                }
                other => return other.decided(),
            }
        }
    }
}
