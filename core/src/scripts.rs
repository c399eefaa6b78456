//! The Lua scripts in `lua/`, embedded at compile time with their SHA1 computed once.

use crate::limit::Algorithm;
use redis::Script;
use std::sync::LazyLock;

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("../../lua/", $file))));
    };
}

script!(FIXED_WINDOW, "fixed_window.lua");
script!(SLIDING_WINDOW, "sliding_window.lua");
script!(SLIDING_LOG, "sliding_log.lua");
script!(TOKEN_BUCKET, "token_bucket.lua");
script!(LEAKY_BUCKET, "leaky_bucket.lua");
script!(CONCURRENCY, "concurrency.lua");
script!(RESET, "reset.lua");

/// The script that runs `algorithm`.
pub(crate) fn for_algorithm(algorithm: Algorithm) -> &'static Script {
    match algorithm {
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::SlidingWindow => &SLIDING_WINDOW,
        Algorithm::SlidingLog => &SLIDING_LOG,
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        Algorithm::LeakyBucket => &LEAKY_BUCKET,
        Algorithm::Concurrency => &CONCURRENCY,
    }
}

/// Every embedded script as (file name, source, SHA1), for tests and tooling.
pub fn all() -> Vec<(&'static str, &'static str, String)> {
    macro_rules! entry {
        ($file:literal, $s:ident) => {
            (
                $file,
                include_str!(concat!("../../lua/", $file)),
                $s.get_hash().to_string(),
            )
        };
    }
    vec![
        entry!("fixed_window.lua", FIXED_WINDOW),
        entry!("sliding_window.lua", SLIDING_WINDOW),
        entry!("sliding_log.lua", SLIDING_LOG),
        entry!("token_bucket.lua", TOKEN_BUCKET),
        entry!("leaky_bucket.lua", LEAKY_BUCKET),
        entry!("concurrency.lua", CONCURRENCY),
        entry!("reset.lua", RESET),
    ]
}
