//! The Lua scripts in `lua/`, assembled at compile time and embedded with their SHA1
//! computed once. Every script is `prelude.lua` + the algorithm file(s) it needs + one
//! `main_*.lua`, so each algorithm is written once and shared by single and layered checks.

use crate::limit::Algorithm;
use redis::Script;
use std::sync::LazyLock;

macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("../../lua/", $file))
    };
}

macro_rules! all_algorithms {
    () => {
        concat!(
            lua!("fixed_window.lua"),
            lua!("sliding_window.lua"),
            lua!("sliding_log.lua"),
            lua!("token_bucket.lua"),
            lua!("leaky_bucket.lua"),
            lua!("concurrency.lua")
        )
    };
}

/// Check scripts give nothing back: no REFUND table, so the algorithm files skip defining
/// their refund functions (see prelude.lua).
macro_rules! check_script {
    ($name:ident, $file:literal) => {
        const $name: &str = concat!(
            "local REFUND\n",
            lua!("prelude.lua"),
            lua!($file),
            lua!("main_check.lua")
        );
    };
}

check_script!(FIXED_WINDOW_SRC, "fixed_window.lua");
check_script!(SLIDING_WINDOW_SRC, "sliding_window.lua");
check_script!(SLIDING_LOG_SRC, "sliding_log.lua");
check_script!(TOKEN_BUCKET_SRC, "token_bucket.lua");
check_script!(LEAKY_BUCKET_SRC, "leaky_bucket.lua");
check_script!(CONCURRENCY_SRC, "concurrency.lua");
const LAYERED_SRC: &str = concat!(
    "local REFUND = {}\n",
    lua!("prelude.lua"),
    all_algorithms!(),
    lua!("main_layered.lua")
);
const REFUND_SRC: &str = concat!(
    "local REFUND = {}\n",
    lua!("prelude.lua"),
    all_algorithms!(),
    lua!("main_refund.lua")
);
const RESET_SRC: &str = concat!(lua!("prelude.lua"), lua!("reset.lua"));
const MIGRATE_DUMP_SRC: &str = concat!(lua!("prelude.lua"), lua!("migrate_dump.lua"));
const MIGRATE_RESTORE_SRC: &str = concat!(lua!("prelude.lua"), lua!("migrate_restore.lua"));

/// (name, source) of every assembled script.
const SOURCES: &[(&str, &str)] = &[
    ("fixed_window", FIXED_WINDOW_SRC),
    ("sliding_window", SLIDING_WINDOW_SRC),
    ("sliding_log", SLIDING_LOG_SRC),
    ("token_bucket", TOKEN_BUCKET_SRC),
    ("leaky_bucket", LEAKY_BUCKET_SRC),
    ("concurrency", CONCURRENCY_SRC),
    ("layered", LAYERED_SRC),
    ("refund", REFUND_SRC),
    ("reset", RESET_SRC),
    ("migrate_dump", MIGRATE_DUMP_SRC),
    ("migrate_restore", MIGRATE_RESTORE_SRC),
];

static SCRIPTS: LazyLock<Vec<Script>> =
    LazyLock::new(|| SOURCES.iter().map(|(_, s)| Script::new(s)).collect());

/// The check script of `algorithm`.
pub(crate) fn for_algorithm(algorithm: Algorithm) -> &'static Script {
    &SCRIPTS[check_index(algorithm)]
}

/// The source of [`for_algorithm`]'s script (for EVAL after a NOSCRIPT reply).
pub(crate) fn source_for_algorithm(algorithm: Algorithm) -> &'static str {
    SOURCES[check_index(algorithm)].1
}

fn check_index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingWindow => 1,
        Algorithm::SlidingLog => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::LeakyBucket => 4,
        Algorithm::Concurrency => 5,
    }
}

pub(crate) fn layered() -> &'static Script {
    &SCRIPTS[6]
}
pub(crate) fn refund() -> &'static Script {
    &SCRIPTS[7]
}
pub(crate) fn reset() -> &'static Script {
    &SCRIPTS[8]
}
pub(crate) fn migrate_dump() -> &'static Script {
    &SCRIPTS[9]
}
pub(crate) fn migrate_restore() -> &'static Script {
    &SCRIPTS[10]
}

/// Every assembled script as (name, source, SHA1), for tests and tooling.
pub fn all() -> Vec<(&'static str, &'static str, String)> {
    SOURCES
        .iter()
        .zip(SCRIPTS.iter())
        .map(|((name, src), s)| (*name, *src, s.get_hash().to_string()))
        .collect()
}
