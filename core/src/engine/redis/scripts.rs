//! The Lua scripts in `core/lua/`, assembled at compile time and embedded with their SHA1
//! computed once. Every script is `prelude.lua` + the algorithm file(s) it needs + one
//! `main_*.lua`, so each algorithm is written once and shared by single and layered checks.

use crate::policy::Algorithm;
use redis::Script;
use std::sync::LazyLock;

macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("../../../lua/", $file))
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
/// Each algorithm has two: one check per call (`main_check.lua`) and a batch of checks per
/// call (`main_batch.lua`).
macro_rules! check_script {
    ($name:ident, $main:literal, $file:literal) => {
        const $name: &str = concat!(
            "local REFUND\n",
            lua!("prelude.lua"),
            lua!($file),
            lua!("check.lua"),
            lua!($main)
        );
    };
}

check_script!(FIXED_WINDOW_SRC, "main_check.lua", "fixed_window.lua");
check_script!(SLIDING_WINDOW_SRC, "main_check.lua", "sliding_window.lua");
check_script!(SLIDING_LOG_SRC, "main_check.lua", "sliding_log.lua");
check_script!(TOKEN_BUCKET_SRC, "main_check.lua", "token_bucket.lua");
check_script!(LEAKY_BUCKET_SRC, "main_check.lua", "leaky_bucket.lua");
check_script!(CONCURRENCY_SRC, "main_check.lua", "concurrency.lua");
check_script!(FIXED_WINDOW_BATCH_SRC, "main_batch.lua", "fixed_window.lua");
check_script!(
    SLIDING_WINDOW_BATCH_SRC,
    "main_batch.lua",
    "sliding_window.lua"
);
check_script!(SLIDING_LOG_BATCH_SRC, "main_batch.lua", "sliding_log.lua");
check_script!(TOKEN_BUCKET_BATCH_SRC, "main_batch.lua", "token_bucket.lua");
check_script!(LEAKY_BUCKET_BATCH_SRC, "main_batch.lua", "leaky_bucket.lua");
check_script!(CONCURRENCY_BATCH_SRC, "main_batch.lua", "concurrency.lua");
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
const RELEASE_SRC: &str = concat!(
    "local REFUND = {}\n",
    lua!("prelude.lua"),
    lua!("concurrency.lua"),
    lua!("release.lua")
);

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
    ("release", RELEASE_SRC),
    ("fixed_window_batch", FIXED_WINDOW_BATCH_SRC),
    ("sliding_window_batch", SLIDING_WINDOW_BATCH_SRC),
    ("sliding_log_batch", SLIDING_LOG_BATCH_SRC),
    ("token_bucket_batch", TOKEN_BUCKET_BATCH_SRC),
    ("leaky_bucket_batch", LEAKY_BUCKET_BATCH_SRC),
    ("concurrency_batch", CONCURRENCY_BATCH_SRC),
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

const ALGORITHMS: usize = 6;
/// Where the batch scripts start in [`SOURCES`]: its last entries, one per algorithm in
/// [`check_index`] order.
const BATCH_BASE: usize = SOURCES.len() - ALGORITHMS;

/// An algorithm's two check scripts, as the pipelined connection sends them: a burst's
/// checks of one algorithm go out as one batch call, a lone check as a single one.
pub(crate) struct CheckScripts {
    pub single_sha: &'static str,
    pub single_src: &'static str,
    pub batch_sha: &'static str,
    pub batch_src: &'static str,
}

static CHECK_SCRIPTS: LazyLock<Vec<CheckScripts>> = LazyLock::new(|| {
    (0..ALGORITHMS)
        .map(|i| CheckScripts {
            single_sha: SCRIPTS[i].get_hash(),
            single_src: SOURCES[i].1,
            batch_sha: SCRIPTS[BATCH_BASE + i].get_hash(),
            batch_src: SOURCES[BATCH_BASE + i].1,
        })
        .collect()
});

/// [`CheckScripts`] of `algorithm`.
pub(crate) fn check_scripts(algorithm: Algorithm) -> &'static CheckScripts {
    &CHECK_SCRIPTS[check_index(algorithm)]
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
pub(crate) fn release() -> &'static Script {
    &SCRIPTS[11]
}

/// Every assembled script as (name, source, SHA1), for tests and tooling.
pub fn all() -> Vec<(&'static str, &'static str, String)> {
    SOURCES
        .iter()
        .zip(SCRIPTS.iter())
        .map(|((name, src), s)| (*name, *src, s.get_hash().to_string()))
        .collect()
}
