//! The Lua scripts in `core/lua/`, assembled at compile time and embedded with their SHA1
//! computed once. Every script is `prelude.lua` + the algorithm file(s) it needs + one
//! `main_*.lua`, so each algorithm is written once and shared by single and layered checks.

use crate::policy::Algorithm;
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
            lua!("bucket_refund.lua"),
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
/// Each algorithm has three: one check per call (`main_check.lua`), the same in shadow mode
/// (`main_check.lua` again, with `SHADOW` set: one source for both) and a batch of checks
/// per call (`main_batch.lua`). The single-check ones answer a plain check
/// (`check_plain.lua`) before the rest of the check's functions are defined.
macro_rules! check_script {
    ($name:ident, "main_check.lua", $file:literal) => {
        check_script!($name, "main_check.lua", $file, "local SHADOW\n");
    };
    ($name:ident, "main_batch.lua", $file:literal) => {
        const $name: &str = concat!(
            "local REFUND\n",
            "local SHADOW\n",
            lua!("prelude.lua"),
            lua!("override.lua"),
            lua!($file),
            lua!("check.lua"),
            lua!("main_batch.lua")
        );
    };
    ($name:ident, "main_check.lua", $file:literal, $flag:literal) => {
        const $name: &str = concat!(
            "local REFUND\n",
            $flag,
            lua!("prelude.lua"),
            lua!($file),
            lua!("check_plain.lua"),
            lua!("override.lua"),
            lua!("check.lua"),
            lua!("main_check.lua")
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
check_script!(
    FIXED_WINDOW_SHADOW_SRC,
    "main_check.lua",
    "fixed_window.lua",
    "local SHADOW = true\n"
);
check_script!(
    SLIDING_WINDOW_SHADOW_SRC,
    "main_check.lua",
    "sliding_window.lua",
    "local SHADOW = true\n"
);
check_script!(
    SLIDING_LOG_SHADOW_SRC,
    "main_check.lua",
    "sliding_log.lua",
    "local SHADOW = true\n"
);
check_script!(
    TOKEN_BUCKET_SHADOW_SRC,
    "main_check.lua",
    "token_bucket.lua",
    "local SHADOW = true\n"
);
check_script!(
    LEAKY_BUCKET_SHADOW_SRC,
    "main_check.lua",
    "leaky_bucket.lua",
    "local SHADOW = true\n"
);
const LAYERED_SRC: &str = concat!(
    "local REFUND = {}\n",
    lua!("prelude.lua"),
    lua!("override.lua"),
    all_algorithms!(),
    lua!("main_layered.lua")
);
const REFUND_SRC: &str = concat!(
    "local REFUND = {}\n",
    lua!("prelude.lua"),
    all_algorithms!(),
    lua!("main_refund.lua")
);
/// Charge, refund, reserve and settle: one script per algorithm, so that a call defines
/// the functions of its own algorithm only (settle.lua skips the others' definitions).
macro_rules! settle_script {
    ($name:ident, $file:literal) => {
        const $name: &str = concat!(
            "local REFUND\n",
            lua!("prelude.lua"),
            lua!("override.lua"),
            lua!($file),
            lua!("check.lua"),
            lua!("settle.lua"),
            lua!("main_settle.lua")
        );
    };
}

settle_script!(FIXED_WINDOW_SETTLE_SRC, "fixed_window.lua");
settle_script!(SLIDING_WINDOW_SETTLE_SRC, "sliding_window.lua");
settle_script!(SLIDING_LOG_SETTLE_SRC, "sliding_log.lua");
settle_script!(TOKEN_BUCKET_SETTLE_SRC, "token_bucket.lua");
settle_script!(LEAKY_BUCKET_SETTLE_SRC, "leaky_bucket.lua");
/// Charge, refund and settle of every limit of a multi-limit policy (`main_settle_multi.lua`).
const SETTLE_MULTI_SRC: &str = concat!(
    "local REFUND\n",
    lua!("prelude.lua"),
    lua!("override.lua"),
    all_algorithms!(),
    lua!("settle.lua"),
    lua!("main_settle_multi.lua")
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

/// Every script the engine runs, named by what it does rather than where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptId {
    /// One check (`main_check.lua`) of an algorithm.
    Check(Algorithm),
    /// A batch of checks of one algorithm (`main_batch.lua`), as the pipe sends a burst.
    Batch(Algorithm),
    /// One check in shadow mode (`main_check.lua` with `SHADOW` set), counting would-be
    /// denials.
    Shadow(Algorithm),
    Layered,
    Refund,
    Reset,
    MigrateDump,
    MigrateRestore,
    Release,
    /// Charge, refund, reserve or settle (`main_settle.lua`) of an algorithm (none for
    /// concurrency: leases are acquired and released).
    Settle(Algorithm),
    /// Charge, refund or settle of a multi-limit policy (`main_settle_multi.lua`).
    SettleMulti,
}

/// Every script: its id, the name [`all`] gives it, its assembled source. The one table of
/// scripts; a script's place in it is its place in `SCRIPTS`.
const TABLE: [(ScriptId, &str, &str); 29] = {
    use Algorithm as A;
    use ScriptId::*;
    [
        (Check(A::FixedWindow), "fixed_window", FIXED_WINDOW_SRC),
        (
            Check(A::SlidingWindow),
            "sliding_window",
            SLIDING_WINDOW_SRC,
        ),
        (Check(A::SlidingLog), "sliding_log", SLIDING_LOG_SRC),
        (Check(A::TokenBucket), "token_bucket", TOKEN_BUCKET_SRC),
        (Check(A::LeakyBucket), "leaky_bucket", LEAKY_BUCKET_SRC),
        (Check(A::Concurrency), "concurrency", CONCURRENCY_SRC),
        (Layered, "layered", LAYERED_SRC),
        (Refund, "refund", REFUND_SRC),
        (Reset, "reset", RESET_SRC),
        (MigrateDump, "migrate_dump", MIGRATE_DUMP_SRC),
        (MigrateRestore, "migrate_restore", MIGRATE_RESTORE_SRC),
        (Release, "release", RELEASE_SRC),
        (
            Batch(A::FixedWindow),
            "fixed_window_batch",
            FIXED_WINDOW_BATCH_SRC,
        ),
        (
            Batch(A::SlidingWindow),
            "sliding_window_batch",
            SLIDING_WINDOW_BATCH_SRC,
        ),
        (
            Batch(A::SlidingLog),
            "sliding_log_batch",
            SLIDING_LOG_BATCH_SRC,
        ),
        (
            Batch(A::TokenBucket),
            "token_bucket_batch",
            TOKEN_BUCKET_BATCH_SRC,
        ),
        (
            Batch(A::LeakyBucket),
            "leaky_bucket_batch",
            LEAKY_BUCKET_BATCH_SRC,
        ),
        (
            Batch(A::Concurrency),
            "concurrency_batch",
            CONCURRENCY_BATCH_SRC,
        ),
        (
            Shadow(A::FixedWindow),
            "fixed_window_shadow",
            FIXED_WINDOW_SHADOW_SRC,
        ),
        (
            Shadow(A::SlidingWindow),
            "sliding_window_shadow",
            SLIDING_WINDOW_SHADOW_SRC,
        ),
        (
            Shadow(A::SlidingLog),
            "sliding_log_shadow",
            SLIDING_LOG_SHADOW_SRC,
        ),
        (
            Shadow(A::TokenBucket),
            "token_bucket_shadow",
            TOKEN_BUCKET_SHADOW_SRC,
        ),
        (
            Shadow(A::LeakyBucket),
            "leaky_bucket_shadow",
            LEAKY_BUCKET_SHADOW_SRC,
        ),
        (
            Settle(A::FixedWindow),
            "fixed_window_settle",
            FIXED_WINDOW_SETTLE_SRC,
        ),
        (
            Settle(A::SlidingWindow),
            "sliding_window_settle",
            SLIDING_WINDOW_SETTLE_SRC,
        ),
        (
            Settle(A::SlidingLog),
            "sliding_log_settle",
            SLIDING_LOG_SETTLE_SRC,
        ),
        (
            Settle(A::TokenBucket),
            "token_bucket_settle",
            TOKEN_BUCKET_SETTLE_SRC,
        ),
        (
            Settle(A::LeakyBucket),
            "leaky_bucket_settle",
            LEAKY_BUCKET_SETTLE_SRC,
        ),
        (SettleMulti, "settle_multi", SETTLE_MULTI_SRC),
    ]
};

impl ScriptId {
    fn index(self) -> usize {
        TABLE
            .iter()
            .position(|(id, _, _)| *id == self)
            .expect("every script is in TABLE")
    }

    /// The assembled source (sent with EVAL after a NOSCRIPT reply).
    pub fn source(self) -> &'static str {
        TABLE[self.index()].2
    }

    /// The script, with its SHA1 computed once.
    pub fn script(self) -> &'static Script {
        &SCRIPTS[self.index()]
    }
}

static SCRIPTS: LazyLock<Vec<Script>> =
    LazyLock::new(|| TABLE.iter().map(|(_, _, src)| Script::new(src)).collect());

/// An algorithm's two check scripts, as the pipelined connection sends them: a burst's
/// checks of one algorithm go out as one batch call, a lone check as a single one.
pub(crate) struct CheckScripts {
    pub single_sha: &'static str,
    pub single_src: &'static str,
    pub batch_sha: &'static str,
    pub batch_src: &'static str,
}

/// By [`Algorithm`] (its declaration order).
static CHECK_SCRIPTS: LazyLock<Vec<CheckScripts>> = LazyLock::new(|| {
    Algorithm::ALL
        .iter()
        .map(|a| CheckScripts {
            single_sha: ScriptId::Check(*a).script().get_hash(),
            single_src: ScriptId::Check(*a).source(),
            batch_sha: ScriptId::Batch(*a).script().get_hash(),
            batch_src: ScriptId::Batch(*a).source(),
        })
        .collect()
});

/// [`CheckScripts`] of `algorithm`.
pub(crate) fn check_scripts(algorithm: Algorithm) -> &'static CheckScripts {
    &CHECK_SCRIPTS[algorithm as usize]
}

/// Every assembled script as (name, source, SHA1), for tests and tooling.
pub fn all() -> Vec<(&'static str, &'static str, String)> {
    TABLE
        .iter()
        .zip(SCRIPTS.iter())
        .map(|((_, name, src), s)| (*name, *src, s.get_hash().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_in_the_table_once() {
        for (i, (id, _, _)) in TABLE.iter().enumerate() {
            assert_eq!(id.index(), i, "{id:?} twice");
        }
        let mut names: Vec<_> = TABLE.iter().map(|(_, name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len());
        for (i, a) in Algorithm::ALL.iter().enumerate() {
            assert_eq!(
                *a as usize, i,
                "CHECK_SCRIPTS is indexed by declaration order"
            );
            assert_eq!(check_scripts(*a).single_src, ScriptId::Check(*a).source());
            assert_eq!(check_scripts(*a).batch_src, ScriptId::Batch(*a).source());
        }
    }
}
