#!/usr/bin/env bash
# Runs every test of the project: Rust (fmt, clippy, unit and integration tests against
# real redis-server processes), then `make dist` (the one release build), each binding's
# suite on those artifacts, and the install tests of dist/ in an environment without Rust
# (scripts/test-dist.sh). Installs what is missing. Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_redis
ensure_rust

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# the oldest Rust the crates claim (rust-version in Cargo.toml) still builds them
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
echo "== cargo +$msrv check (the workspace's rust-version)"
rustup toolchain list | grep -q "^$msrv" || rustup toolchain install "$msrv" --profile minimal
CARGO_TARGET_DIR="$(target_dir)/msrv" cargo "+$msrv" check --workspace --all-targets --quiet
echo "== cargo test (Rust core, CLI, C ABI)"
if ! cargo test --workspace --quiet > /tmp/shardlimit-cargo-test.log 2>&1; then
  tail -80 /tmp/shardlimit-cargo-test.log
  echo "cargo test failed" >&2
  exit 1
fi
grep -E "^test result" /tmp/shardlimit-cargo-test.log
passed=$(grep -Eo "test result: ok\. [0-9]+ passed" /tmp/shardlimit-cargo-test.log | awk '{s+=$4} END {print s+0}')
echo "Rust: $passed passed, 0 failed"

echo "== make dist"
scripts/dist.sh
for suite in c python node java dist overrides valkey overload serve platforms; do
  if [ -x "scripts/test-$suite.sh" ]; then
    echo "== scripts/test-$suite.sh"
    "scripts/test-$suite.sh"
  fi
done
echo "all suites passed"
