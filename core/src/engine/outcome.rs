//! What the engines decide, in the form both return (the in-memory engine and the Redis
//! scripts' replies alike), for the limiter to turn into decisions.

use crate::policy::{AutoBlock, Compiled};
use std::sync::Arc;

/// What an algorithm decided, in integers (µs). `retry_us` is `None` when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub allowed: bool,
    pub remaining: u64,
    pub reset_us: u64,
    pub retry_us: Option<u64>,
    pub delay_us: u64,
}

impl Outcome {
    pub(crate) fn deny(remaining: u64, reset_us: u64, retry_us: Option<u64>) -> Outcome {
        Outcome {
            allowed: false,
            remaining,
            reset_us,
            retry_us,
            delay_us: 0,
        }
    }
    pub(crate) fn allow(remaining: u64, reset_us: u64, delay_us: u64) -> Outcome {
        Outcome {
            allowed: true,
            remaining,
            reset_us,
            retry_us: None,
            delay_us,
        }
    }
}

/// What one engine call decided: the algorithm's outcome, the block-list verdict and the
/// units admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raw {
    pub outcome: Outcome,
    pub blocked: BlockVerdict,
    pub granted: u64,
}

/// The block list's part in a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockVerdict {
    /// The key is not blocked.
    Clear,
    /// The key was blocked already: nothing else was decided.
    Blocked,
    /// This denial blocked the key (automatic blocking).
    BlockedNow,
}

impl BlockVerdict {
    pub fn is_blocked(self) -> bool {
        self != BlockVerdict::Clear
    }
}

/// One layer of a layered check, as the engines take it.
#[derive(Debug, Clone)]
pub(crate) struct LayerReq<'a> {
    pub scope: &'a Arc<str>,
    pub compiled: Compiled,
    pub key: &'a str,
    pub cost: u64,
    pub auto_block: Option<AutoBlock>,
}

/// A layered check's result: `deciding` is the index of the layer that denied (`None`
/// when all allowed); `outcomes` has one entry per layer.
#[derive(Debug, Clone)]
pub(crate) struct LayeredRaw {
    pub now: u64,
    pub deciding: Option<usize>,
    pub blocked: BlockVerdict,
    pub outcomes: Vec<Outcome>,
}

pub(crate) fn blocked_outcome(ttl_us: Option<u64>) -> Outcome {
    Outcome {
        allowed: false,
        remaining: 0,
        reset_us: ttl_us.unwrap_or(0),
        retry_us: ttl_us,
        delay_us: 0,
    }
}
