#!/usr/bin/env bash
# The quick loop before a commit (`make test-fast`): formatting, lints, the unit tests of
# every crate and the integration tests that need no redis-server, and the C header's drift
# check. No Redis, no `make dist`, no binding toolchains (Python, Node, Go, C compilers).
# `make test` (scripts/test.sh) stays what CI runs: every suite, against real redis-servers.
#
# The integration tests below start no redis-server (they use the in-memory engine, a port
# nothing listens on, or a fake server); every other test file in core/tests, cli/tests and
# examples/rust/tests starts one. A test file added here must stay that way.
# Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

step() { echo "== $*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "unit tests of every crate (cargo test --lib)"
# the C ABI's two unit tests that start a redis-server are left to `make test`
cargo test --workspace --lib --quiet -- \
  --skip tests::decisions_over_tls_with_mtls \
  --skip pending::tests::on_redis_a_call_completes_on_the_runtime_and_a_stopped_one_can_be_cancelled

step "integration tests that need no redis-server"
cargo test --quiet -p shardlimit \
  --test alloc --test cooperative --test docs_errors --test generation --test hostile \
  --test metrics --test properties --test spec
cargo test --quiet -p shardlimit-tower --test layer --test options
cargo test --quiet -p shardlimit-cli --test precision
cargo test --quiet -p shardlimit-examples --test per_route --test chart_is_current

step "include/shardlimit.h is what cbindgen generates"
want=$(sed -n 's/^CBINDGEN_VERSION=\([0-9.]*\).*/\1/p' scripts/test-c.sh)
cbindgen=""
for c in "$(command -v cbindgen || true)" "$(target_dir)/tools/bin/cbindgen"; do
  if [ -n "$c" ] && [ -x "$c" ] && [ "$("$c" --version)" = "cbindgen $want" ]; then
    cbindgen="$c"
    break
  fi
done
if [ -z "$cbindgen" ]; then
  echo "skipped: cbindgen $want is not installed (scripts/test-c.sh installs it into $(target_dir)/tools)"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$cbindgen" --quiet --config bindings/c/cbindgen.toml --crate shardlimit-c --output "$work/shardlimit.h"
  if ! cmp -s include/shardlimit.h "$work/shardlimit.h"; then
    diff -u include/shardlimit.h "$work/shardlimit.h" | head -60 || true
    echo "include/shardlimit.h is stale: regenerate it (see bindings/c/cbindgen.toml)" >&2
    exit 1
  fi
  echo "up to date"
fi
echo "test-fast passed (make test runs every suite against redis-server)"
