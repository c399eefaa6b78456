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

/// Every script the engine runs, named by what it does rather than where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptId {
    /// One check (`main_check.lua`) of an algorithm.
    Check(Algorithm),
    /// A batch of checks of one algorithm (`main_batch.lua`), as the pipe sends a burst.
    Batch(Algorithm),
    Layered,
    Refund,
    Reset,
    MigrateDump,
    MigrateRestore,
    Release,
}

const ALGORITHMS: [Algorithm; 6] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::Concurrency,
];

impl ScriptId {
    /// Every script, in the order [`all`] lists them.
    const ALL: [ScriptId; 18] = {
        use ScriptId::*;
        let a = ALGORITHMS;
        [
            Check(a[0]),
            Check(a[1]),
            Check(a[2]),
            Check(a[3]),
            Check(a[4]),
            Check(a[5]),
            Layered,
            Refund,
            Reset,
            MigrateDump,
            MigrateRestore,
            Release,
            Batch(a[0]),
            Batch(a[1]),
            Batch(a[2]),
            Batch(a[3]),
            Batch(a[4]),
            Batch(a[5]),
        ]
    };

    /// The script's place in [`ScriptId::ALL`] (and in `SCRIPTS`).
    fn index(self) -> usize {
        let algorithm = |a: Algorithm| match a {
            Algorithm::FixedWindow => 0,
            Algorithm::SlidingWindow => 1,
            Algorithm::SlidingLog => 2,
            Algorithm::TokenBucket => 3,
            Algorithm::LeakyBucket => 4,
            Algorithm::Concurrency => 5,
        };
        match self {
            ScriptId::Check(a) => algorithm(a),
            ScriptId::Layered => 6,
            ScriptId::Refund => 7,
            ScriptId::Reset => 8,
            ScriptId::MigrateDump => 9,
            ScriptId::MigrateRestore => 10,
            ScriptId::Release => 11,
            ScriptId::Batch(a) => 12 + algorithm(a),
        }
    }

    /// The name [`all`] gives it.
    fn name(self) -> &'static str {
        match self {
            ScriptId::Check(a) => a.name(),
            ScriptId::Batch(Algorithm::FixedWindow) => "fixed_window_batch",
            ScriptId::Batch(Algorithm::SlidingWindow) => "sliding_window_batch",
            ScriptId::Batch(Algorithm::SlidingLog) => "sliding_log_batch",
            ScriptId::Batch(Algorithm::TokenBucket) => "token_bucket_batch",
            ScriptId::Batch(Algorithm::LeakyBucket) => "leaky_bucket_batch",
            ScriptId::Batch(Algorithm::Concurrency) => "concurrency_batch",
            ScriptId::Layered => "layered",
            ScriptId::Refund => "refund",
            ScriptId::Reset => "reset",
            ScriptId::MigrateDump => "migrate_dump",
            ScriptId::MigrateRestore => "migrate_restore",
            ScriptId::Release => "release",
        }
    }

    /// The assembled source (sent with EVAL after a NOSCRIPT reply).
    pub fn source(self) -> &'static str {
        use Algorithm as A;
        match self {
            ScriptId::Check(A::FixedWindow) => FIXED_WINDOW_SRC,
            ScriptId::Check(A::SlidingWindow) => SLIDING_WINDOW_SRC,
            ScriptId::Check(A::SlidingLog) => SLIDING_LOG_SRC,
            ScriptId::Check(A::TokenBucket) => TOKEN_BUCKET_SRC,
            ScriptId::Check(A::LeakyBucket) => LEAKY_BUCKET_SRC,
            ScriptId::Check(A::Concurrency) => CONCURRENCY_SRC,
            ScriptId::Batch(A::FixedWindow) => FIXED_WINDOW_BATCH_SRC,
            ScriptId::Batch(A::SlidingWindow) => SLIDING_WINDOW_BATCH_SRC,
            ScriptId::Batch(A::SlidingLog) => SLIDING_LOG_BATCH_SRC,
            ScriptId::Batch(A::TokenBucket) => TOKEN_BUCKET_BATCH_SRC,
            ScriptId::Batch(A::LeakyBucket) => LEAKY_BUCKET_BATCH_SRC,
            ScriptId::Batch(A::Concurrency) => CONCURRENCY_BATCH_SRC,
            ScriptId::Layered => LAYERED_SRC,
            ScriptId::Refund => REFUND_SRC,
            ScriptId::Reset => RESET_SRC,
            ScriptId::MigrateDump => MIGRATE_DUMP_SRC,
            ScriptId::MigrateRestore => MIGRATE_RESTORE_SRC,
            ScriptId::Release => RELEASE_SRC,
        }
    }

    /// The script, with its SHA1 computed once.
    pub fn script(self) -> &'static Script {
        &SCRIPTS[self.index()]
    }
}

static SCRIPTS: LazyLock<Vec<Script>> = LazyLock::new(|| {
    ScriptId::ALL
        .iter()
        .map(|id| Script::new(id.source()))
        .collect()
});

/// An algorithm's two check scripts, as the pipelined connection sends them: a burst's
/// checks of one algorithm go out as one batch call, a lone check as a single one.
pub(crate) struct CheckScripts {
    pub single_sha: &'static str,
    pub single_src: &'static str,
    pub batch_sha: &'static str,
    pub batch_src: &'static str,
}

static CHECK_SCRIPTS: LazyLock<Vec<CheckScripts>> = LazyLock::new(|| {
    ALGORITHMS
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
    &CHECK_SCRIPTS[ScriptId::Check(algorithm).index()]
}

/// Every assembled script as (name, source, SHA1), for tests and tooling.
pub fn all() -> Vec<(&'static str, &'static str, String)> {
    ScriptId::ALL
        .iter()
        .map(|id| (id.name(), id.source(), id.script().get_hash().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_sits_at_its_index_once() {
        for (i, id) in ScriptId::ALL.iter().enumerate() {
            assert_eq!(id.index(), i, "{id:?}");
        }
        let mut names: Vec<_> = ScriptId::ALL.iter().map(|id| id.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ScriptId::ALL.len());
    }
}
