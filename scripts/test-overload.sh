#!/bin/sh
# Exact under load, Redis healthy: the callers' CPUs saturated by busy processes each test
# starts and kills by PID, `on_error: open` (the default) so that a fallback would show as an
# admission over the limit. Every shape must admit exactly the limit, with no fallback.
# Each language's shapes are one function below; the whole suite takes about a minute.
set -eu
cd "$(dirname "$0")/.."

# Rust: 64 threads on one key through the blocking path (the path of C, Go and Python sync
# calls), 20,000 concurrent async checks in one process, 200 tasks of a multi-thread runtime
# on the I/O thread (core/tests/overload.rs; `#[ignore]`d in the plain `cargo test` run so
# that they run here alone, one at a time, and print their figures).
overload_rust() {
  echo "-- Rust core: blocking threads, 20,000 async checks, runtime tasks"
  cargo test -p shardlimit --test overload --quiet -- --ignored --nocapture --test-threads 1
}

overload_rust
echo "overload: every shape admitted exactly its limit"
