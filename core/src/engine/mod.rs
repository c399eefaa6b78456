//! The two engines that decide: in memory ([`memory`], with the algorithms' arithmetic in
//! [`algo`]) and on Redis shards ([`redis`], running the scripts of `core/lua/`). For the
//! same (time, key, cost) sequence both give the same decisions.

pub(crate) mod algo;
pub(crate) mod exact;
pub(crate) mod expiry;
pub(crate) mod memory;
pub(crate) mod outcome;
pub(crate) mod redis;
pub(crate) mod settle;
