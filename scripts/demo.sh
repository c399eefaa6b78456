#!/usr/bin/env bash
# The main job: start three local Redis shards, then show shardlimit enforcing the shared
# limits of shard-config.json from several processes at once, exactly.
# Without redis-server (and no way to install it) it runs on the in-memory engine instead.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

echo "building the shardlimit CLI (release)..."
cargo build --release --quiet -p shardlimit-cli
SL=target/release/shardlimit
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

CONFIG=shard-config.json
if ensure_redis 2>/dev/null; then
  for port in 6391 6392 6393; do
    if redis-cli -p $port ping >/dev/null 2>&1; then
      echo "port $port is already in use by a Redis; stop it first (the demo starts its own shards)" >&2
      exit 1
    fi
    mkdir -p "$WORK/$port"
    redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$port" >"$WORK/$port.log" 2>&1 &
    PIDS+=($!)
  done
  for port in 6391 6392 6393; do
    for _ in $(seq 100); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.05; done
  done
  echo "started 3 Redis shards on 127.0.0.1:6391-6393 (engine: redis)"
  PROCS=4
else
  echo "redis-server is not available: running on the embedded in-memory engine, in one process"
  python3 - "$CONFIG" > "$WORK/memory.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1])); cfg.pop("shards", None); print(json.dumps(cfg))
PY
  CONFIG="$WORK/memory.json"
  PROCS=1
fi
$SL config validate "$CONFIG"

echo
echo "== routing: which shard owns which key (jump hash of xxh64; {tags} keep keys together)"
$SL route --config "$CONFIG" user:alice user:bob ip:203.0.113.7 '{acme}:user:1' '{acme}:user:2'

echo
echo "== policy \"login\" (fixed_window, 5 per minute): 7 attempts by user:alice"
printf '%-8s %-8s %-10s %-14s %s\n' attempt allowed remaining retry_after_ms shard
for i in $(seq 7); do
  out=$($SL check --config "$CONFIG" --policy login user:alice || true)
  python3 -c '
import json, sys
d = json.loads(sys.argv[2]); s = d["shard"]
print("%-8s %-8s %-10s %-14s %s" % (sys.argv[1], str(d["allowed"]).lower(), d["remaining"], d["retry_after_ms"] if d["retry_after_ms"] is not None else "-", s["name"] if s else "memory"))' "$i" "$out"
done

echo
echo "== policy \"billing\" (sliding_log, exactly 20 per hour per key): $PROCS process(es) x 64 concurrent callers, 10 keys"
for p in $(seq $PROCS); do
  $SL bench --config "$CONFIG" --policy billing --concurrency 64 --requests 600 --keys 10 --json > "$WORK/bench.$p.json" &
done
wait_ok=0
for job in $(jobs -p); do
  case " ${PIDS[*]} " in *" $job "*) continue ;; esac
  wait "$job" || wait_ok=1
done
[ $wait_ok = 0 ] || { echo "a bench process failed" >&2; exit 1; }
python3 - "$WORK" "$PROCS" <<'PY'
import glob, json, sys
rows = [json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/bench.*.json"))]
print(f"{'process':<8} {'sent':>6} {'allowed':>8} {'denied':>7} {'decisions/s':>12}")
for i, r in enumerate(rows, 1):
    print(f"{i:<8} {r['requests']:>6} {r['allowed']:>8} {r['denied']:>7} {r['decisions_per_sec']:>12.0f}")
total = sum(r["allowed"] for r in rows)
print(f"total allowed on the 10 shared keys: {total} (limit: 10 keys x 20 = 200) -> {'exact' if total == 200 else 'WRONG'}")
sys.exit(0 if total == 200 else 1)
PY
