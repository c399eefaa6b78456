#!/usr/bin/env bash
# Redis cost per decision of each algorithm: runs `shardlimit bench` on one fresh local
# Redis per algorithm and reads the scripts' server-side time (INFO commandstats: the usec
# of every EVALSHA and EVAL, over the decisions made; a call may carry a batch of checks)
# and the memory per key (MEMORY USAGE of the keys written).
#   bash scripts/bench-algorithms.sh [requests]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
N=${1:-100000}
cargo build --release --quiet -p shardlimit-cli
SL=$(target_dir)/release/shardlimit
DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >/dev/null 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
printf '%-16s %12s %10s %10s %18s %12s\n' algorithm decisions/s p50_us p99_us redis_us/decision bytes/key
for spec in \
  'fixed_window:{"algorithm":"fixed_window","limit":1000000,"window":"1h"}' \
  'sliding_window:{"algorithm":"sliding_window","limit":1000000,"window":"1h"}' \
  'sliding_log:{"algorithm":"sliding_log","limit":100,"window":"1h"}' \
  'token_bucket:{"algorithm":"token_bucket","capacity":1000000,"refill_per_sec":1000}' \
  'leaky_bucket:{"algorithm":"leaky_bucket","capacity":1000000,"leak_per_sec":1000}' \
  'concurrency:{"algorithm":"concurrency","max":100,"lease_ttl":"1h"}'; do
  name=${spec%%:*}; limit=${spec#*:}
  redis-cli -p "$PORT" FLUSHALL >/dev/null
  redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null
  cat > "$DIR/cfg.json" <<JSON
{"shards":[{"name":"bench","url":"redis://127.0.0.1:$PORT"}],"timeout_ms":1000,"policies":{"p":$limit}}
JSON
  out=$($SL bench --config "$DIR/cfg.json" --policy p --concurrency 64 --requests "$N" --keys 1000 --json)
  usec=$(redis-cli -p "$PORT" INFO commandstats | python3 -c '
import re, sys
total = sum(int(m) for m in re.findall(r"^cmdstat_eval(?:sha)?:.*?,usec=(\d+),", sys.stdin.read(), re.M))
print("%.1f" % (total / float(sys.argv[1])))' "$N")
  key=$(redis-cli -p "$PORT" --scan --pattern 'sl:s:p:*' | head -1 || true)
  bytes=$(redis-cli -p "$PORT" MEMORY USAGE "$key")
  python3 -c 'import json,sys; d=json.loads(sys.argv[2]); print("%-16s %12.0f %10.0f %10.0f %18s %12s" % (sys.argv[1], d["decisions_per_sec"], d["p50_us"], d["p99_us"], sys.argv[3], sys.argv[4]))' "$name" "$out" "$usec" "$bytes"
done
