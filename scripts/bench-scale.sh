#!/usr/bin/env bash
# Scale out (`make bench-scale`): decisions/s and Redis's own work per decision with 1, 2, 4
# and 8 shards, as client-side shards and as a Redis Cluster of as many primaries, every
# redis-server on 127.0.0.1 started and stopped (by PID) by bench/scale.py; then the memory
# per key of each algorithm. The work grows with the shards (the same load per shard at
# every size); Redis pinned to CPU 1, the client to CPU 0.
#   bash scripts/bench-scale.sh [--quick] [--write FILE] [bench/scale.py options...]
# --quick: one round of 2 and 8 shards, two algorithms, small runs (checks that the script
#   works; its numbers mean little).
# --write FILE: put the section into FILE (docs/benchmarks.md keeps it when `make bench`
#   rewrites the rest: bench/report.py's KEPT).
# A decision that did not come from Redis (a fallback or an error) fails the run; the count
# is printed per run and in total.
# (SHARDLIMIT_BIN=path: that build of the CLI instead of the release build of this tree.)
# Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
command -v taskset >/dev/null 2>&1 || apt_install util-linux
ARGS=()
CMD="bash scripts/bench-scale.sh" # (as written into the section: without --write FILE)
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ARGS+=(--rounds 1 --sizes 2,8 --algorithms fixed_window,token_bucket --per-shard 3000)
      CMD+=" --quick" ;;
    --write) ARGS+=(--write "$2"); shift ;;
    *) ARGS+=("$1"); CMD+=" $1" ;;
  esac
  shift
done
if [ -z "${SHARDLIMIT_BIN:-}" ]; then cargo build --release --quiet -p shardlimit-cli; fi
SL=${SHARDLIMIT_BIN:-$(target_dir)/release/shardlimit}
BUILD="release build"
[ -z "${SHARDLIMIT_BIN:-}" ] || BUILD="the CLI \`$SHARDLIMIT_BIN\`"
python3 bench/scale.py --cli "$SL" "${ARGS[@]}" --meta "build=$BUILD" \
  --meta "command=$CMD" --meta "date=$(date -u +%FT%TZ)" \
  --meta "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- core cli || echo +changes)" \
  --meta "redis=$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')" \
  --meta "cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs"
