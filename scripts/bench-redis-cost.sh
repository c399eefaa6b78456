#!/usr/bin/env bash
# Redis's own work per decision, per algorithm: shardlimit's scripts (driven by
# `shardlimit bench`, the real client and its real arguments) against a minimal
# single-purpose script for each algorithm (bench/*_min.lua, driven by redis-benchmark),
# and for the fixed window also the Redis commands rate-limiter-flexible's RateLimiterRedis
# runs per consume (bench/fixed_window_rlf.lua). Two figures, both read from Redis:
#   usec/dec  INFO commandstats: the script commands' total usec / decisions (alternating
#             rounds, the median; wall-clock time, so noisy on a loaded machine)
#             (shardlimit bench runs 16 concurrent callers: the client sends the checks
#             that queue up in one batch script call, as a service's would)
#   Ir/dec    instructions Redis executes per decision, counted by callgrind on a second
#             redis-server (only inside EVALSHA and argument parsing), one caller, so one
#             decision per script call on both sides: deterministic, the figure to compare
#             on a shared machine; then again with 16 and 64 callers in flight (rows
#             "batched": the client packs the checks queued for the shard into one batch
#             script call, main_batch.lua; how many per call is timing, so it is printed)
# The last row: a layered check of 3 fixed-window layers (the script check_all and serve's
# multi-descriptor calls run, driven by redis-benchmark with the client's argument layout,
# one EVALSHA per decision) against a minimal all-or-nothing script of 3 counters
# (bench/fixed_window_layered_min.lua).
# Every policy has limits far above the traffic: every decision is an admission (the hot
# path), and a decision that did not come from Redis fails the run.
#   bash scripts/bench-redis-cost.sh [decisions per round] [rounds] [callgrind decisions]
#   (SHARDLIMIT_BIN=path: that build of the CLI instead of a debug build of this tree)
# (make bench-redis-cost; not part of make test)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
N=${1:-20000}
ROUNDS=${2:-3}
NCG=${3:-300}
KEYS=${BENCH_KEYS:-1000} # (BENCH_KEYS: fewer keys, more hits per key and window)
# SHARDLIMIT_BIN: another build of the CLI (its scripts are embedded), to compare two
if [ -z "${SHARDLIMIT_BIN:-}" ]; then cargo build --quiet -p shardlimit-cli; fi
SL=${SHARDLIMIT_BIN:-$(target_dir)/debug/shardlimit}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
start_redis() { # port [wrapper...]
  local port=$1
  shift
  "$@" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
    >"$DIR/redis-$port.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 600); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server on $port did not start" >&2
  return 1
}

ALGOS="fixed_window sliding_window sliding_log token_bucket leaky_bucket concurrency"
policy() {
  case $1 in
    fixed_window | sliding_window) echo '{"algorithm":"'"$1"'","limit":1000000000,"window":"1m","on_error":"error"}' ;;
    sliding_log) echo '{"algorithm":"sliding_log","limit":1000000,"window":"1m","on_error":"error"}' ;;
    token_bucket) echo '{"algorithm":"token_bucket","capacity":1000000000,"refill_per_sec":1000000,"on_error":"error"}' ;;
    leaky_bucket) echo '{"algorithm":"leaky_bucket","capacity":1000000000,"leak_per_sec":1000000,"on_error":"error"}' ;;
    concurrency) echo '{"algorithm":"concurrency","max":1000000,"lease_ttl":"1m","on_error":"error"}' ;;
  esac
}
# the minimal script of each and its arguments after the key (redis-benchmark fills
# __rand_int__: the key, and a unique member for the sorted sets)
min_script() {
  case $1 in
    fixed_window) echo "fixed_window_min 1000000000 60000" ;;
    fixed_window_rlf) echo "fixed_window_rlf 1 60" ;;
    sliding_window) echo "sliding_window_min 1000000000 60000" ;;
    sliding_log) echo "sliding_log_min 1000000 60000000 m:__rand_int__" ;;
    token_bucket) echo "token_bucket_min 1000000000 1000000" ;;
    leaky_bucket) echo "leaky_bucket_min 1000000000 1" ;;
    concurrency) echo "concurrency_min 1000000 60000000 l:__rand_int__" ;;
    fixed_window_layered) echo "fixed_window_layered_min 1000000000 60000" ;;
  esac
}
config() { # port algorithm
  echo '{"shards":[{"name":"b","url":"redis://127.0.0.1:'"$1"'"}],"timeout_ms":60000,
   "policies":{"p":'"$(policy "$2")"'}}' >"$DIR/$2-$1.json"
  echo "$DIR/$2-$1.json"
}
# script commands' calls and usec since the last CONFIG RESETSTAT
script_stats() { # port
  redis-cli -p "$1" INFO commandstats | tr -d '\r' | python3 -c '
import sys, re
calls = usec = 0
for l in sys.stdin:
    m = re.match(r"cmdstat_(evalsha|eval|evalsha_ro|eval_ro):calls=(\d+),usec=(\d+)", l)
    if m: calls += int(m.group(2)); usec += int(m.group(3))
print(calls, usec)'
}
run_sl() { # port algorithm decisions [concurrency] -> "decisions"
  local out
  out=$($SL bench --config "$(config "$1" "$2")" --policy p --concurrency "${4:-16}" --requests "$3" \
    --keys $KEYS --json)
  python3 -c '
import json, sys
d = json.loads(sys.argv[1]); n = int(sys.argv[2])
if d["allowed"] != n or d.get("errors", 0):
    sys.exit("shardlimit bench: %d of %d decisions were Redis admissions (%s)" % (d["allowed"], n, sys.argv[1]))
print(n)' "$out" "$3"
}
run_min() { # port name decisions [concurrency]
  local m sha
  m=($(min_script "$2"))
  sha=$(redis-cli -p "$1" -x SCRIPT LOAD <"bench/${m[0]}.lua")
  if [ "$2" = fixed_window_layered ]; then
    redis-benchmark -p "$1" -c "${4:-16}" -n "$3" -r $KEYS -q EVALSHA "$sha" 3 "k1:__rand_int__" \
      "k2:__rand_int__" "k3:__rand_int__" "${m[@]:1}" >/dev/null
  else
    redis-benchmark -p "$1" -c "${4:-16}" -n "$3" -r $KEYS -q EVALSHA "$sha" 1 "k:${m[0]}:__rand_int__" \
      "${m[@]:1}" >/dev/null
  fi
  echo "$3"
}
# shardlimit's layered script (its code as the CLI embeds it) with 3 fixed-window layers,
# the argument layout of core/src/engine/redis/protocol/layered.rs: per layer its state,
# block-list and denial keys, then code, limit, period (µs), cost, extra, block-after,
# within, for, reason
run_lay() { # port decisions [concurrency]
  local sha
  sha=$($SL script layered 2>/dev/null | redis-cli -p "$1" -x SCRIPT LOAD)
  # shellcheck disable=SC2086
  redis-benchmark -p "$1" -c "${3:-16}" -n "$2" -r $KEYS -q EVALSHA "$sha" 9 \
    "s1:__rand_int__" "b1:__rand_int__" "d1:__rand_int__" "s2:__rand_int__" "b2:__rand_int__" \
    "d2:__rand_int__" "s3:__rand_int__" "b3:__rand_int__" "d3:__rand_int__" 0 3 \
    fw 1000000000 60000000 1 "" 0 0 0 "" fw 1000000000 60000000 1 "" 0 0 0 "" \
    fw 1000000000 60000000 1 "" 0 0 0 "" >/dev/null
  echo "$2"
}
drive() { # port kind(sl|min|lay) name decisions [concurrency]
  case $2 in
    sl) run_sl "$1" "$3" "$4" ${5:+"$5"} >/dev/null ;;
    min) run_min "$1" "$3" "$4" ${5:+"$5"} >/dev/null ;;
    lay) run_lay "$1" "$4" ${5:+"$5"} >/dev/null ;;
  esac
}
one() { # port kind(sl|min|lay) name decisions -> "usec_per_call usec_per_decision"
  # warm up (the scripts' first EVAL compiles them), then count from zero
  drive "$1" "$2" "$3" 100
  redis-cli -p "$1" CONFIG RESETSTAT >/dev/null
  drive "$1" "$2" "$3" "$4"
  read -r calls usec <<<"$(script_stats "$1")"
  python3 -c 'import sys; c,u,n=map(int,sys.argv[1:]); print("%.2f %.2f" % (u/max(c,1), u/n))' \
    "$calls" "$usec" "$4"
}
median() { python3 -c 'import sys,statistics; print("%.2f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }

PORT=$(free_port)
start_redis "$PORT"
echo "Redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'): $N decisions per round over $KEYS keys, $ROUNDS alternating rounds, median"
declare -A SLU SLP MNU MNP
for algo in $ALGOS fixed_window_rlf fixed_window_layered; do SLU[$algo]=""; SLP[$algo]=""; MNU[$algo]=""; MNP[$algo]=""; done
for r in $(seq "$ROUNDS"); do
  for algo in $ALGOS; do
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    read -r a b <<<"$(one "$PORT" sl "$algo" "$N")"
    SLU[$algo]+=" $a"; SLP[$algo]+=" $b"
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    read -r a b <<<"$(one "$PORT" min "$algo" "$N")"
    MNU[$algo]+=" $a"; MNP[$algo]+=" $b"
  done
  redis-cli -p "$PORT" FLUSHALL >/dev/null
  read -r a b <<<"$(one "$PORT" min fixed_window_rlf "$N")"
  MNU[fixed_window_rlf]+=" $a"; MNP[fixed_window_rlf]+=" $b"
  redis-cli -p "$PORT" FLUSHALL >/dev/null
  read -r a b <<<"$(one "$PORT" lay fixed_window_layered "$N")"
  SLU[fixed_window_layered]+=" $a"; SLP[fixed_window_layered]+=" $b"
  redis-cli -p "$PORT" FLUSHALL >/dev/null
  read -r a b <<<"$(one "$PORT" min fixed_window_layered "$N")"
  MNU[fixed_window_layered]+=" $a"; MNP[fixed_window_layered]+=" $b"
done

# instructions: a second redis-server under callgrind, collecting only inside EVALSHA and
# the parsing of its arguments; zeroed after a warm-up round, dumped after NCG decisions
IR=()
if command -v valgrind >/dev/null && command -v callgrind_control >/dev/null && [ "$NCG" -gt 0 ]; then
  CGP=$(free_port)
  start_redis "$CGP" valgrind --tool=callgrind --callgrind-out-file="$DIR/cg.%p" \
    --toggle-collect=evalShaCommand --toggle-collect=processMultibulkBuffer
  CGPID=${PIDS[-1]}
  ir() { # kind name [callers: 1 unless given]
    redis-cli -p "$CGP" FLUSHALL >/dev/null
    drive "$CGP" "$1" "$2" 50 "${3:-1}"
    redis-cli -p "$CGP" CONFIG RESETSTAT >/dev/null
    callgrind_control -z "$CGPID" >/dev/null 2>&1
    drive "$CGP" "$1" "$2" "$NCG" "${3:-1}"
    rm -f "$DIR"/cg.*.[0-9]*
    callgrind_control -d "$CGPID" >/dev/null 2>&1
    local f calls
    f=$(ls -t "$DIR"/cg.*.[0-9]* | head -1)
    read -r calls _ <<<"$(script_stats "$CGP")"
    # with callers: "Ir/decision decisions/call" (script calls, those of other scripts
    # such as a lease's release included)
    python3 -c '
import sys, re
t = None
for l in open(sys.argv[1]):
    if l.startswith("summary:"): t = int(l.split()[1])
n, c, batched = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] != "1"
print(int(t / n), *(["%.1f" % (n / max(c, 1))] if batched else []))' "$f" "$NCG" "$calls" "${3:-1}"
  }
  declare -A IRS IRM IRB16 IRB64
  for algo in $ALGOS; do
    IRS[$algo]=$(ir sl "$algo"); IRM[$algo]=$(ir min "$algo")
    IRB16[$algo]=$(ir sl "$algo" 16); IRB64[$algo]=$(ir sl "$algo" 64)
  done
  IRM[fixed_window_rlf]=$(ir min fixed_window_rlf)
  IRS[fixed_window_layered]=$(ir lay fixed_window_layered)
  IRM[fixed_window_layered]=$(ir min fixed_window_layered)
fi

row() { # label sl_usec_per_call sl_usec min_usec_per_call min_usec sl_ir min_ir
  python3 -c '
import sys
l, a, b, c, d, e, f = sys.argv[1:]
ir = "| %s | %s | %.2fx" % (e, f, int(e) / int(f)) if e else "| | |"
print("| %s | %s | %s | %s | %s | %.2fx %s |" % (l, a, b, c, d, float(b) / float(d), ir))' "$@"
}
echo
echo "| algorithm | shardlimit µs/call | shardlimit µs/decision | yardstick µs/call | yardstick µs/decision | ratio | shardlimit Ir/decision | yardstick Ir/decision | Ir ratio |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for algo in $ALGOS; do
  # shellcheck disable=SC2086
  row "$algo (minimal script)" "$(median ${SLU[$algo]})" "$(median ${SLP[$algo]})" \
    "$(median ${MNU[$algo]})" "$(median ${MNP[$algo]})" "${IRS[$algo]:-}" "${IRM[$algo]:-}"
done
# shellcheck disable=SC2086
row "fixed_window (rate-limiter-flexible's commands)" "$(median ${SLU[fixed_window]})" \
  "$(median ${SLP[fixed_window]})" "$(median ${MNU[fixed_window_rlf]})" \
  "$(median ${MNP[fixed_window_rlf]})" "${IRS[fixed_window]:-}" "${IRM[fixed_window_rlf]:-}"
# shellcheck disable=SC2086
row "layered, 3 fixed_window layers (minimal all-or-nothing script)" \
  "$(median ${SLU[fixed_window_layered]})" "$(median ${SLP[fixed_window_layered]})" \
  "$(median ${MNU[fixed_window_layered]})" "$(median ${MNP[fixed_window_layered]})" \
  "${IRS[fixed_window_layered]:-}" "${IRM[fixed_window_layered]:-}"
# the same checks with 16 and 64 callers in flight: the client sends the checks that queue
# up for one shard in one batch script call (main_batch.lua), as a service's would under
# load; the yardsticks stay one decision per call (rate-limiter-flexible cannot batch)
for c in 16 64; do
  for algo in $ALGOS; do
    if [ "$c" = 16 ]; then b=${IRB16[$algo]:-}; else b=${IRB64[$algo]:-}; fi
    [ -n "$b" ] || continue
    read -r b per <<<"$b"
    python3 -c '
import sys
l, e, f = sys.argv[1:]
print("| %s | | | | | | %s | %s | %.2fx |" % (l, e, f, int(e) / int(f)))' \
      "$algo, $c in flight, batched ($per decisions per script call; minimal script, one per call)" "$b" "${IRM[$algo]}"
  done
  b=${IRB16[fixed_window]:-}
  [ "$c" = 64 ] && b=${IRB64[fixed_window]:-}
  if [ -n "$b" ]; then
    read -r b per <<<"$b"
    python3 -c '
import sys
l, e, f = sys.argv[1:]
print("| %s | | | | | | %s | %s | %.2fx |" % (l, e, f, int(e) / int(f)))' \
      "fixed_window, $c in flight, batched ($per decisions per script call; rate-limiter-flexible's commands, one per call)" \
      "$b" "${IRM[fixed_window_rlf]}"
  fi
done
