#!/usr/bin/env bash
# The Node binding's tests: builds the addon (release), type-checks the .d.ts against a
# TypeScript usage file, and runs `node --test` against real redis-server processes that
# the tests start on 127.0.0.1. Run from the repository root; needs Node >= 18, npm, Rust.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v redis-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  # openssl: test/tls.test.js makes its CA with tests/tls/gen-certs.sh
  echo "test-node: installing redis-server and openssl"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server openssl >/dev/null
fi

cd "$root/bindings/node"
echo "test-node: npm ci"
# --ignore-scripts: the install step would build the addon; it is built explicitly below
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

echo "test-node: building the addon (release)"
npm run --silent build

echo "test-node: tsc --noEmit"
npm run --silent typecheck

echo "test-node: node --test"
node --test test/*.test.js

echo "test-node: examples/node (Express app smoke test, real redis-server on 127.0.0.1)"
cd "$root/examples/node"
npm ci --no-audit --no-fund --loglevel=error
node --test test/*.test.js
