#!/usr/bin/env bash
# The client must not be the bottleneck: `shardlimit bench` (token bucket, one local Redis)
# against redis-benchmark running the very same script with EVALSHA, in one run.
#   bash scripts/bench-redis.sh [requests]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
N=${1:-500000}
cargo build --release --quiet -p shardlimit-cli
SL=$(target_dir)/release/shardlimit
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >/dev/null 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
cat > "$DIR/cfg.json" <<JSON
{"shards":[{"name":"bench","url":"redis://127.0.0.1:$PORT"}],"timeout_ms":1000,
 "policies":{"api":{"algorithm":"token_bucket","capacity":100,"refill_per_sec":10}}}
JSON
$SL script token_bucket >"$DIR/tb.lua" 2>"$DIR/sha"
SHA=$(redis-cli -p "$PORT" -x SCRIPT LOAD <"$DIR/tb.lua")
[ "$SHA" = "$(cat "$DIR/sha")" ] || { echo "SHA mismatch" >&2; exit 1; }
echo "redis-benchmark -P 16 -c 50, EVALSHA of the token bucket script ($N requests, 1000 keys):"
# the check's arguments as core/src/engine/redis/protocol.rs (CheckRequest::write) writes
# them for this policy (a plain check, core/lua/check.lua): KEYS state, block entry; ARGV
# cost, then the policy's limit and period (the emission interval, µs), and the call's tag
RB=$(redis-benchmark -p "$PORT" -P 16 -c 50 -n "$N" -r 1000 --csv \
  EVALSHA "$SHA" 2 'sl:s:api:tb:{bench:__rand_int__}' 'sl:b:{bench:__rand_int__}' \
  1 100 100000 7 | tail -1 | cut -d, -f2 | tr -d '"')
echo "  $RB requests/s"
redis-cli -p "$PORT" FLUSHALL >/dev/null
for c in 64 256; do
  echo "shardlimit bench --concurrency $c ($N requests, 1000 keys):"
  OUT=$($SL bench --config "$DIR/cfg.json" --policy api --concurrency $c --requests "$N" --keys 1000 --json)
  echo "  $OUT"
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("  ratio to redis-benchmark: %.2f" % (d["decisions_per_sec"]/float(sys.argv[2])))' "$OUT" "$RB"
done
