#!/usr/bin/env bash
# The Node binding's tests, on the release addon of dist/npm (`make dist`; built by
# scripts/dist.sh when missing): the linux-x64-gnu platform package is unpacked into
# bindings/node/node_modules, where binding.js finds it as an installed package would be;
# then the .d.ts is type-checked against a TypeScript usage file, and `node --test` runs
# against real redis-server processes that the tests start on 127.0.0.1. Run from the
# repository root; needs Node >= 18 and npm (no Rust).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
# (ensure_redis installs openssl too: test/tls.test.js makes its CA with tests/tls/gen-certs.sh)
. scripts/lib.sh
ensure_redis
DIST=${DIST_DIR:-$root/dist}
version=$(workspace_version)
platform_pkg="$DIST/npm/shardlimit-binding-linux-x64-gnu-$version.tgz"
[ -f "$platform_pkg" ] || scripts/dist.sh

cd "$root/bindings/node"
echo "test-node: npm ci"
npm ci --no-audit --no-fund --loglevel=error

echo "test-node: the addon of $(basename "$platform_pkg")"
# an addon built in this folder (`npm run build`) would be loaded first: not the one tested
rm -f shardlimit.*.node
dest=node_modules/@shardlimit/binding-linux-x64-gnu
rm -rf "$dest"
mkdir -p "$dest"
tar -C "$dest" --strip-components=1 -xzf "$platform_pkg"
node -e 'const p = require.resolve("@shardlimit/binding-linux-x64-gnu"); if (!p.includes("node_modules")) process.exit(1); require("./index.js")'

echo "test-node: tsc --noEmit"
npm run --silent typecheck

echo "test-node: node --test"
node --test test/*.test.js

echo "test-node: examples/node (Express app smoke test, real redis-server on 127.0.0.1)"
cd "$root/examples/node"
npm ci --no-audit --no-fund --loglevel=error
# the quick start of examples/node/README.md: the release tarballs over the source link,
# so the example runs as a user installs it (no Rust)
npm install --no-save --no-audit --no-fund --loglevel=error "$DIST/npm/shardlimit-$version.tgz" "$platform_pkg"
node -e 'const p = require.resolve("shardlimit"); if (!p.includes("node_modules/shardlimit/")) { console.error(p); process.exit(1) }'
node --test test/*.test.js
