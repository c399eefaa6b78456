#!/usr/bin/env bash
# `make bench-serve`: `shardlimit serve` against Lyft's ratelimit (github.com/envoyproxy/ratelimit),
# both as Envoy's rate limit service over gRPC, against one redis-server, with the same load.
#
# - Lyft's ratelimit is built from source at a pinned commit ($LYFT_COMMIT) into a cache
#   directory ($BENCH_SERVE_CACHE, default $CARGO_TARGET_DIR/bench-serve): from a checkout
#   when LYFT_RATELIMIT_SRC names one (a clone, or a bare git directory: the commit is
#   taken from it; its Go dependencies come from the Go module proxy), else `go install` of
#   that commit's module version from the Go module proxy (which may not serve it: the one
#   here answers 403 for it, so this was measured with LYFT_RATELIMIT_SRC).
#   Nothing of its code is in this repository.
# - shardlimit serve: the release build of this tree (`cargo build --release`).
# - The load: serve/bench/rlsload (Go, grpc-go and go-control-plane's RLS v3 stubs), one
#   process pinned to CPU 0: CONC requests in flight over 2 HTTP/2 connections, each request
#   1 or 3 descriptors [{d<i>, k<random of KEYS>}], hits_addend 1, no deadline.
# - redis-server and both services pinned to CPU 1 (what `make bench` pins Redis to); the
#   services idle while the other is measured. Rounds alternate the services.
# - Both limits are fixed windows of 100,000,000 a minute per key (Lyft has no other
#   algorithm), so no request is denied: the work compared is the decision itself.
# - Only decisions that came from Redis count: shardlimit's policies are `on_error: error`
#   (a Redis failure is a gRPC error, which rlsload counts apart), Lyft's local cache is off
#   (its default); and every round checks Redis's own command counts: one INCRBY per
#   descriptor per decision (Lyft's pipeline; inside shardlimit's script), or the run fails.
# - Per round: decisions/s, p50/p99 latency (rlsload's clock), CPU per decision of the
#   service and of redis-server (/proc/PID/stat), Redis calls per decision; the load
#   average before and after. The summary is the median of the rounds.
#
# Options (environment): ROUNDS (3), SECONDS_PER_RUN (5), CONC (32), KEYS (1000).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$SHARDLIMIT_ROOT"

LYFT_COMMIT=f2fb15770f7fd1c88ca6c3a1b58ee513917ace96 # 2026-07-06, main of envoyproxy/ratelimit
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CONC=${CONC:-32}
KEYS=${KEYS:-1000}

ensure_redis
ensure_go
command -v taskset >/dev/null 2>&1 || apt_install util-linux
target=$(target_dir)
CACHE=${BENCH_SERVE_CACHE:-$target/bench-serve}
mkdir -p "$CACHE"

# ---- Lyft's ratelimit, built once per commit
LYFT_BIN="$CACHE/ratelimit-${LYFT_COMMIT:0:12}"
if [ ! -x "$LYFT_BIN" ]; then
  if [ -n "${LYFT_RATELIMIT_SRC:-}" ]; then
    src="$CACHE/ratelimit-src-${LYFT_COMMIT:0:12}"
    rm -rf "$src" && mkdir -p "$src"
    if git --git-dir="$LYFT_RATELIMIT_SRC" rev-parse --verify -q "$LYFT_COMMIT^{commit}" >/dev/null 2>&1; then
      git --git-dir="$LYFT_RATELIMIT_SRC" archive "$LYFT_COMMIT" | tar -x -C "$src"
    elif git -C "$LYFT_RATELIMIT_SRC" rev-parse --verify -q "$LYFT_COMMIT^{commit}" >/dev/null 2>&1; then
      git -C "$LYFT_RATELIMIT_SRC" archive "$LYFT_COMMIT" | tar -x -C "$src"
    else
      echo "LYFT_RATELIMIT_SRC=$LYFT_RATELIMIT_SRC has no commit $LYFT_COMMIT" >&2
      exit 1
    fi
    echo "== building Lyft's ratelimit ${LYFT_COMMIT:0:12} from $LYFT_RATELIMIT_SRC (Go modules from the proxy)"
    (cd "$src" && go build -p 1 -o "$LYFT_BIN" ./src/service_cmd)
  else
    version=$(go list -m -f '{{.Version}}' "github.com/envoyproxy/ratelimit@${LYFT_COMMIT:0:12}") || {
      echo "the Go module proxy does not serve github.com/envoyproxy/ratelimit at ${LYFT_COMMIT:0:12}:" >&2
      echo "set LYFT_RATELIMIT_SRC to a clone of github.com/envoyproxy/ratelimit that has it" >&2
      exit 1
    }
    echo "== building Lyft's ratelimit $version (go install from the Go module proxy)"
    GOBIN="$CACHE/gobin" GOFLAGS=-mod=mod go install -p 1 "github.com/envoyproxy/ratelimit/src/service_cmd@$version"
    mv "$CACHE/gobin/service_cmd" "$LYFT_BIN"
  fi
fi

# ---- the load client and shardlimit serve
LOAD="$CACHE/rlsload"
(cd serve/bench/rlsload && go build -p 1 -o "$LOAD" .)
echo "== release build (cargo build --release -p shardlimit-serve)"
cargo build --release --quiet -p shardlimit-serve
SERVE="$target/release/shardlimit-serve"

RUN=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$RUN"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # wait_port PORT PID
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "process $2 exited" >&2; return 1; }
    sleep 0.05
  done
  echo "port $1 did not open" >&2
  return 1
}

# ---- Redis, pinned to CPU 1
RPORT=$(free_port)
taskset -c 1 redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$RUN" \
  --logfile "$RUN/redis.log" &
RPID=$!
PIDS+=("$RPID")
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$RPORT" ping >/dev/null

# ---- shardlimit serve, pinned to CPU 1
SL_GRPC=$(free_port)
cat >"$RUN/shardlimit.json" <<EOF
{
  "key_prefix": "sl:",
  "timeout_ms": 1000,
  "on_error": "error",
  "shards": [{"name": "a", "url": "redis://127.0.0.1:$RPORT"}],
  "policies": {"per_minute": {"algorithm": "fixed_window", "limit": 100000000, "window": "1m"}},
  "gateway": {"domains": {"bench": {"rules": [
    {"name": "d0", "match": [{"key": "d0"}], "policy": "per_minute", "key": "d0:{d0}"},
    {"name": "d1", "match": [{"key": "d1"}], "policy": "per_minute", "key": "d1:{d1}"},
    {"name": "d2", "match": [{"key": "d2"}], "policy": "per_minute", "key": "d2:{d2}"}
  ]}}}
}
EOF
taskset -c 1 "$SERVE" --config "$RUN/shardlimit.json" --grpc "127.0.0.1:$SL_GRPC" --http off \
  --log-level warn 2>"$RUN/serve.log" &
SL_PID=$!
PIDS+=("$SL_PID")
wait_port "$SL_GRPC" "$SL_PID"

# ---- Lyft's ratelimit, pinned to CPU 1 (its documented settings; stats not sent anywhere)
LY_GRPC=$(free_port)
mkdir -p "$RUN/runtime/ratelimit/config"
cat >"$RUN/runtime/ratelimit/config/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: d0
    rate_limit: {unit: minute, requests_per_unit: 100000000}
  - key: d1
    rate_limit: {unit: minute, requests_per_unit: 100000000}
  - key: d2
    rate_limit: {unit: minute, requests_per_unit: 100000000}
EOF
env USE_STATSD=false LOG_LEVEL=warn BACKEND_TYPE=redis \
  REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RPORT" \
  RUNTIME_ROOT="$RUN/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
  GRPC_HOST=127.0.0.1 GRPC_PORT="$LY_GRPC" HOST=127.0.0.1 PORT="$(free_port)" \
  DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
  taskset -c 1 "$LYFT_BIN" 2>"$RUN/lyft.log" &
LY_PID=$!
PIDS+=("$LY_PID")
wait_port "$LY_GRPC" "$LY_PID"

cpu_of() { awk '{print ($14+$15)*10000}' "/proc/$1/stat"; } # µs (CLK_TCK 100)
calls_of() { # calls_of ERE: calls of the commands it matches (subcommands too) in $stats
  printf '%s\n' "$stats" | tr -d '\r' \
    | awk -F'[:=,]' -v re="^cmdstat_($1)(\\|.*)?$" '$1 ~ re {s += $3} END {print s + 0}'
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

RESULTS="$RUN/results.jsonl"
echo "== $ROUNDS rounds of ${SECONDS_PER_RUN}s per service and shape, $CONC in flight, $KEYS keys per descriptor (load $(loadavg))"
for round in $(seq "$ROUNDS"); do
  order=(lyft shardlimit)
  [ $((round % 2)) -eq 0 ] && order=(shardlimit lyft)
  for descs in 1 3; do
    for svc in "${order[@]}"; do
      if [ "$svc" = lyft ]; then port=$LY_GRPC pid=$LY_PID; else port=$SL_GRPC pid=$SL_PID; fi
      load=(-addr "127.0.0.1:$port" -domain bench -descriptors "$descs" -keys "$KEYS" -concurrency "$CONC" -conns 2 -warmup 0s)
      # a warm-up run (not counted), then CPU and Redis's counts over the measured run alone
      taskset -c 0 "$LOAD" "${load[@]}" -duration 1s >/dev/null
      redis-cli -p "$RPORT" config resetstat >/dev/null
      l0=$(loadavg); s0=$(cpu_of "$pid"); r0=$(cpu_of "$RPID")
      out=$(taskset -c 0 "$LOAD" "${load[@]}" -duration "${SECONDS_PER_RUN}s" -label "$svc")
      s1=$(cpu_of "$pid"); r1=$(cpu_of "$RPID"); l1=$(loadavg)
      stats=$(redis-cli -p "$RPORT" info commandstats) # (one snapshot: INFO counts itself)
      # every admitted decision increments its descriptors' counters in Redis: INCRBY, from
      # Lyft's pipeline or inside shardlimit's script (commandstats counts those too)
      calls=$(calls_of incrby)
      scripts=$(calls_of 'evalsha|eval')
      all=$(calls_of '.*')
      other=$(calls_of 'config|info|ping|client|hello|command|select')
      python3 - "$out" "$round" "$svc" "$((s1 - s0))" "$((r1 - r0))" "$calls" "$((all - other))" "$l0" "$l1" "$scripts" >>"$RESULTS" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
n = max(d["decisions"], 1)
d.update(round=int(sys.argv[2]), service=sys.argv[3],
         service_cpu_us=int(sys.argv[4]) / n, redis_cpu_us=int(sys.argv[5]) / n,
         redis_calls=int(sys.argv[6]) / n, redis_commands=int(sys.argv[7]) / n,
         load_before=sys.argv[8], load_after=sys.argv[9], script_calls=int(sys.argv[10]) / n)
print(json.dumps(d))
PY
      tail -1 "$RESULTS" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("   round %d %-10s %d desc: %7.0f decisions/s  p50 %5d us  p99 %6d us  service %5.1f us/decision  redis %5.1f us/decision  %.2f commands/decision  errors %d  load %s -> %s" % (
  d["round"], d["service"], d["descriptors"], d["decisions_per_sec"], d["p50_us"], d["p99_us"],
  d["service_cpu_us"], d["redis_cpu_us"], d["redis_commands"], d["errors"], d["load_before"], d["load_after"]))
if d["errors"]:
    print("     first error:", d.get("first_error"))'
    done
  done
done

python3 - "$RESULTS" "$LYFT_COMMIT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = []
for r in rows:
    want = r["descriptors"]
    if r["errors"] or r["decisions"] == 0 or r["redis_calls"] < 0.99 * want:
        bad.append(r)
med = lambda xs: statistics.median(xs)
print()
print("Lyft's ratelimit at %s; median of %d rounds; load average before/after each run in the log above" % (sys.argv[2][:12], max(r["round"] for r in rows)))
print()
print("| service | descriptors | decisions/s | p50 µs | p99 µs | service CPU µs/decision | Redis CPU µs/decision | INCRBY/decision | EVALSHA/decision | Redis commands/decision | errors |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for descs in (1, 3):
    for svc in ("lyft", "shardlimit"):
        rs = [r for r in rows if r["service"] == svc and r["descriptors"] == descs]
        if not rs:
            continue
        name = "Lyft ratelimit " + sys.argv[2][:7] if svc == "lyft" else "shardlimit serve"
        print("| %s | %d | %.0f | %.0f | %.0f | %.1f | %.1f | %.2f | %.2f | %.2f | %d |" % (
            name, descs, med([r["decisions_per_sec"] for r in rs]), med([r["p50_us"] for r in rs]),
            med([r["p99_us"] for r in rs]), med([r["service_cpu_us"] for r in rs]),
            med([r["redis_cpu_us"] for r in rs]), med([r["redis_calls"] for r in rs]),
            med([r["script_calls"] for r in rs]), med([r["redis_commands"] for r in rs]),
            sum(r["errors"] for r in rs)))
print()
print("INCRBY/decision: the counters incremented in Redis (one per descriptor of each admitted")
print("decision: Lyft's pipelined INCRBY+EXPIRE, or inside shardlimit's script), the proof that")
print("every decision counted was made in Redis; EVALSHA/decision: shardlimit's script calls")
print("(below 1: concurrent single checks of one shard share a call); Redis commands/decision:")
print("every command Redis ran, those inside scripts included (INFO commandstats).")
if bad:
    print("\nFAILED: runs with errors, no decisions, or fewer Redis calls than decisions need:", file=sys.stderr)
    for r in bad:
        print("  ", json.dumps(r), file=sys.stderr)
    sys.exit(1)
PY
