#!/usr/bin/env bash
# `make bench`: shardlimit against the latest released peers of each language, in one run,
# written to docs/benchmarks.md.
#   bash scripts/bench-peers.sh [--quick] [--out FILE] [--only SHAPES]
# --quick: one short round (checks that the script works; its numbers mean little).
# --only: a comma list of the shapes to run, of criterion, node-64, py-async, py-sync, go-64,
#   rust, http-express, http-fastapi, http-flask, scale (for working on one; the report then
#   has only their rows, so write it elsewhere with --out).
#
# - The peers are the versions of bench/peers.lock, installed into a scratch directory
#   ($BENCH_SCRATCH, default $CARGO_TARGET_DIR/bench-peers), never into the repository's
#   package files.
# - shardlimit: the release artifacts of dist/ when `make dist` made them (wheel, npm
#   tarballs, C SDK), else the release build (`cargo build --release`, the profile that
#   `make dist` inherits) of this tree; the CLI always from the release build.
# - One redis-server pinned to CPU 1 (taskset); every client process pinned to CPU 0; the
#   HTTP load generator (wrk, 64 connections) on CPU 1 beside Redis.
# - Each shape alternates shardlimit and its peers, one process per library and round,
#   three rounds (medians reported). The machine's load is recorded before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh

QUICK=0
OUT=docs/benchmarks.md
ONLY=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    --only) ONLY=$2; shift ;;
    *) echo "usage: $0 [--quick] [--out FILE] [--only SHAPES]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$QUICK" = 1 ]; then
  ROUNDS=1 TOTAL=30000 SEQ=3000 PYN=5000 PYAN=10000 HTTP_SECS=3 RUST_N=50000 CRIT_SECS=1
else
  ROUNDS=${BENCH_ROUNDS:-3} TOTAL=50000 SEQ=5000 PYN=10000 PYAN=50000 HTTP_SECS=5 RUST_N=100000 CRIT_SECS=3
fi
want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
[ "$(nproc)" -ge 2 ] || { echo "needs two CPUs (Redis on one, the client on the other)" >&2; exit 1; }

ensure_redis
ensure_go
for tool in taskset wrk redis-benchmark; do
  command -v "$tool" >/dev/null 2>&1 || apt_install "$( [ "$tool" = taskset ] && echo util-linux || { [ "$tool" = redis-benchmark ] && echo redis-tools || echo "$tool"; })"
done

LOCK=bench/peers.lock
pin() { # pin ECOSYSTEM NAME -> the locked version
  local v
  v=$(awk -v e="$1" -v n="$2" '$1 == e && $2 == n { print $3 }' "$LOCK")
  [ -n "$v" ] || { echo "$LOCK has no $1 $2" >&2; exit 1; }
  echo "$v"
}

SCRATCH=${BENCH_SCRATCH:-$(target_dir)/bench-peers}
RUN=$SCRATCH/run
rm -rf "$RUN"
mkdir -p "$SCRATCH" "$RUN"
RESULTS=$RUN/results.jsonl
: >"$RESULTS"
LOAD_BEFORE=$(cat /proc/loadavg)
echo "== load before: $LOAD_BEFORE"

# ---- shardlimit: release artifacts
target=$(target_dir)
echo "== release build (cargo build --release)"
# (with --only, the languages the chosen shapes need: Node, Python, Go over the C ABI)
want_any() { local x; for x in "$@"; do want "$x" && return 0; done; return 1; }
NEED_NODE=$(want_any node-64 http-express && echo 1 || true)
NEED_PY=$(want_any py-async py-sync http-fastapi http-flask && echo 1 || true)
NEED_GO=$(want_any go-64 && echo 1 || true)
PYO3_PYTHON=$(command -v python3) cargo build --release --quiet -p shardlimit-cli \
  $( [ -d dist/npm ] && [ -d dist/python ] && [ -d dist/c ] || echo ${NEED_NODE:+-p shardlimit-node} ${NEED_PY:+-p shardlimit-python} ${NEED_GO:+-p shardlimit-c} )
SL_CLI=$target/release/shardlimit
if [ -d dist/npm ] && [ -d dist/python ] && [ -d dist/c ]; then
  ARTIFACTS="dist/ (make dist)"
  # the host's files (make dist-all adds other platforms' beside them)
  NODE_TGZ="$root/dist/npm/shardlimit-$(workspace_version).tgz $root/dist/npm/shardlimit-binding-linux-x64-gnu-$(workspace_version).tgz"
  WHEEL=$(ls "$root"/dist/python/*manylinux_2_28_x86_64.whl)
  rm -rf "$SCRATCH/sdk" && mkdir -p "$SCRATCH/sdk"
  tar -C "$SCRATCH/sdk" -xzf "$(ls "$root"/dist/c/*-x86_64-unknown-linux-gnu.tar.gz)"
  PC_DIR=$(ls -d "$SCRATCH"/sdk/*/lib/pkgconfig)
else
  ARTIFACTS="the release build of this tree (cargo build --release)"
  if [ -n "$NEED_NODE" ]; then
    pkg=$SCRATCH/node-pkg
    rm -rf "$pkg" && mkdir -p "$pkg"
    cp bindings/node/{index.js,index.mjs,index.d.ts,binding.js,host.js,middleware.js,package.json} "$pkg/"
    cp "$target/release/libshardlimit_node.so" "$pkg/shardlimit.linux-x64-gnu.node"
    NODE_TGZ=$pkg
  fi
  if [ -n "$NEED_PY" ]; then
    rm -rf "$SCRATCH/wheel" && mkdir -p "$SCRATCH/wheel"
    python3 scripts/build-wheel.py "$target/release/lib_shardlimit.so" linux_x86_64 "$SCRATCH/wheel" >/dev/null
    WHEEL=$(ls "$SCRATCH"/wheel/*.whl)
  fi
  if [ -n "$NEED_GO" ]; then
    PC_DIR=$SCRATCH/pkgconfig
    bindings/c/gen-pkgconfig.sh "$target/release" "$root/include" "$PC_DIR" >/dev/null
  fi
fi
echo "   shardlimit from $ARTIFACTS"

# ---- peers, pinned, into the scratch directory
NODE_DIR=$SCRATCH/node
VENV=$SCRATCH/venv
PY=$VENV/bin/python
GO_DIR=$SCRATCH/go
GO_REDIS= REDIS_RATE=
if [ -n "$NEED_NODE" ]; then
echo "== Node peers"
mkdir -p "$NODE_DIR"
npm_pkgs=()
for p in rate-limiter-flexible ioredis express-rate-limit rate-limit-redis express; do npm_pkgs+=("$p@$(pin npm "$p")"); done
[ -f "$NODE_DIR/package.json" ] || echo '{"name":"shardlimit-bench-peers","private":true}' >"$NODE_DIR/package.json"
(cd "$NODE_DIR" && npm install --silent --no-audit --no-fund --save-exact "${npm_pkgs[@]}" >/dev/null)
if [ -d "$NODE_TGZ" ]; then
  rm -rf "$NODE_DIR/node_modules/shardlimit" && cp -r "$NODE_TGZ" "$NODE_DIR/node_modules/shardlimit"
else
  (cd "$NODE_DIR" && npm install --silent --no-audit --no-fund --no-save $NODE_TGZ >/dev/null)
fi
export BENCH_PEERS=$NODE_DIR
export SHARDLIMIT_NODE_PACKAGE=$NODE_DIR/node_modules/shardlimit
fi

if [ -n "$NEED_PY" ]; then
echo "== Python peers"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
py_pkgs=()
for p in limits redis coredis slowapi Flask-Limiter fastapi uvicorn flask gunicorn; do py_pkgs+=("$p==$(pin pypi "$p")"); done
"$VENV/bin/pip" install -q --disable-pip-version-check "${py_pkgs[@]}"
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
fi

if [ -n "$NEED_GO" ]; then
echo "== Go peers"
mkdir -p "$GO_DIR"
cp bindings/go/bench/peers/main.go "$GO_DIR/main.go"
cat >"$GO_DIR/go.mod" <<EOF
module shardlimit-bench-peers

go 1.22

require (
	github.com/go-redis/redis_rate/v10 $(pin go github.com/go-redis/redis_rate/v10)
	github.com/redis/go-redis/v9 $(pin go github.com/redis/go-redis/v9)
	github.com/shardlimit/shardlimit/bindings/go v0.0.0
)

replace github.com/shardlimit/shardlimit/bindings/go => $root/bindings/go
EOF
# The go command keys its build cache by the cgo flags, not by pkg-config's answer nor the
# library's bytes: a rebuilt libshardlimit.a at the same path would be linked from the cache
# as it was (a stale library was measured that way once). The library's hash in CGO_CFLAGS
# makes the key follow the library.
GO_LIB_SHA=$(sha256sum "$(PKG_CONFIG_PATH=$PC_DIR pkg-config --variable=libdir shardlimit-static)/libshardlimit.a" | cut -c1-16)
(cd "$GO_DIR" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 && \
  PKG_CONFIG_PATH=$PC_DIR CGO_CFLAGS="-O2 -DSHARDLIMIT_LIB_SHA=$GO_LIB_SHA" GOFLAGS=-mod=mod \
  go build -tags benchpeers -o peers . )
# tidy may raise the minimum go-redis that redis_rate needs: record what was built
GO_REDIS=$(cd "$GO_DIR" && go list -m -f '{{.Version}}' github.com/redis/go-redis/v9)
REDIS_RATE=$(cd "$GO_DIR" && go list -m -f '{{.Version}}' github.com/go-redis/redis_rate/v10)
fi

# ---- Rust in-memory engine against governor's keyed limiter (criterion, core/benches/
# governor.rs), before Redis starts: one thread pinned to CPU 0, two threads on both CPUs;
# short measurement times. bench/report.py reads criterion's estimates.
export CRITERION_HOME=$target/criterion # (where criterion writes, whatever the cwd)
CRIT=$CRITERION_HOME/memory_vs_governor
rm -rf "$CRIT"
if want criterion; then
  echo "== in-memory engine against governor (criterion, ${CRIT_SECS}s per case)"
  cargo bench --quiet -p shardlimit --bench governor --no-run
  crit=(--warm-up-time 1 --measurement-time "$CRIT_SECS")
  taskset -c 0 cargo bench --quiet -p shardlimit --bench governor -- "${crit[@]}" 1_thread | grep -E '^memory_vs_governor|time:'
  cargo bench --quiet -p shardlimit --bench governor -- "${crit[@]}" 2_threads | grep -E '^memory_vs_governor|time:'
fi

# ---- Redis, pinned to CPU 1
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=redis://127.0.0.1:$PORT
taskset -c 1 redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$RUN" \
  --logfile "$RUN/redis.log" &
RPID=$!
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null
  kill "$RPID" 2>/dev/null
  wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
REDIS_VERSION=$(redis-cli -p "$PORT" INFO server | sed -n 's/^redis_version:\(.*\)\r$/\1/p')

# the server time (µs) of the commands that decided since the last reset (INFO
# commandstats: every command but the bench's own INFO, CONFIG, FLUSHALL, SCRIPT and the
# clients' connection set-up). INFO commandstats also counts the commands a script runs,
# whose time is inside the script's own: when scripts ran, their time alone (every client
# measured here decides in scripts: shardlimit's, rate-limiter-flexible's rlflxIncr,
# limits', redis_rate's, rate-limit-redis'), else the commands' (summing both counted the
# scripts' inner commands twice).
script_usec() {
  redis-cli -p "$PORT" INFO commandstats | python3 -c '
import re, sys
skip = {"info", "config", "flushall", "script", "ping", "client", "hello", "select", "command", "auth"}
scripts = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
rows = [(n.split("|")[0], int(c), int(u)) for n, c, u in
        re.findall(r"^cmdstat_([^:]+):calls=(\d+),usec=(\d+),", sys.stdin.read(), re.M)]
in_scripts = sum(u for n, c, u in rows if n in scripts)
ran = sum(c for n, c, u in rows if n in scripts)
print(in_scripts if ran else sum(u for n, c, u in rows if n not in skip))'
}
fresh() { redis-cli -p "$PORT" FLUSHALL >/dev/null; redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null; }

# client SHAPE ROUND LABEL CMD...: runs one library's client pinned to CPU 0; appends its
# JSON line (plus the scripts' server time per decision) to the results
client() {
  local shape=$1 round=$2 label=$3
  shift 3
  want "$shape" || return 0
  fresh
  local line
  line=$(taskset -c 0 "$@") || { echo "$shape/$label failed" >&2; exit 1; }
  local usec
  usec=$(script_usec)
  python3 -c '
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
d.update(shape=sys.argv[2], round=int(sys.argv[3]), label=sys.argv[4],
         redis_script_us=int(sys.argv[5]) / d["decisions"])
d.setdefault("fallbacks", 0)  # (the peers have none: they fail instead)
print(json.dumps(d))' "$line" "$shape" "$round" "$label" "$usec" >>"$RESULTS"
  echo "   $shape round $round $label: $(tail -1 "$RESULTS" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.0f/s p50 %.0f us, client %.1f us/decision, Redis %.2f us/decision, %d fallbacks" % (d["decisions_per_sec"], d["p50_us"], d["client_cpu_us"], d["redis_script_us"], d["fallbacks"]))')"
  no_fallbacks "$shape/$label"
}

# a fallback is not a decision: a run that had any fails (every figure is of decisions
# that came from Redis)
no_fallbacks() {
  local n
  n=$(tail -1 "$RESULTS" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("fallbacks", 0) + d.get("non_2xx", 0))')
  [ "$n" = 0 ] || { echo "$1: $n decisions did not come from Redis (fallbacks or non-2xx answers): the run fails" >&2; exit 1; }
}

# cpu_child CMD...: runs CMD pinned to CPU 0, prints its stdout, then "CPU_US n": the CPU
# it used (its rusage as a child)
cpu_child() {
  taskset -c 0 python3 -c '
import resource, subprocess, sys
out = subprocess.run(sys.argv[1:], check=True, stdout=subprocess.PIPE).stdout.decode()
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(out.strip()); print("CPU_US %d" % ((r.ru_utime + r.ru_stime) * 1e6))' "$@"
}
# redis_cpu: CPU (µs) redis-server has used so far
redis_cpu() { awk '{print ($14+$15)*10000}' "/proc/$RPID/stat"; }

NODE_BENCH=bindings/node/bench/peers.js
PY_BENCH=bindings/python/bench/peers.py
for round in $(seq "$ROUNDS"); do
  echo "== round $round of $ROUNDS: clients ($(date -u +%T))"
  na=(--redis "$URL" --redis-pid "$RPID" --total "$TOTAL" --sequential "$SEQ")
  client node-64 "$round" shardlimit node "$NODE_BENCH" --lib shardlimit "${na[@]}"
  client node-64 "$round" rlf node "$NODE_BENCH" --lib rlf "${na[@]}"
  client node-64 "$round" "shardlimit spin_wait 100us" node "$NODE_BENCH" --lib shardlimit --spin-wait 100us "${na[@]}"
  client node-64 "$round" "shardlimit host transport" node "$NODE_BENCH" --lib shardlimit --transport host "${na[@]}"
  client node-64 "$round" "shardlimit thread transport" node "$NODE_BENCH" --lib shardlimit --transport thread "${na[@]}"
  # (asyncio: more decisions per run, at 50k+/s 10,000 were a tenth of a second)
  paa=(--redis "$URL" --redis-pid "$RPID" --n "$PYAN")
  pa=(--redis "$URL" --redis-pid "$RPID" --n "$PYN")
  client py-async "$round" shardlimit "$PY" "$PY_BENCH" --mode async --lib shardlimit "${paa[@]}"
  client py-async "$round" limits-coredis "$PY" "$PY_BENCH" --mode async --lib limits-coredis "${paa[@]}"
  client py-async "$round" limits-redispy "$PY" "$PY_BENCH" --mode async --lib limits-redispy "${paa[@]}"
  client py-async "$round" "shardlimit host transport" "$PY" "$PY_BENCH" --mode async --lib shardlimit --transport host "${paa[@]}"
  client py-async "$round" "shardlimit thread transport" "$PY" "$PY_BENCH" --mode async --lib shardlimit --transport thread "${paa[@]}"
  client py-sync "$round" shardlimit "$PY" "$PY_BENCH" --mode sync --lib shardlimit "${pa[@]}"
  client py-sync "$round" limits-redispy "$PY" "$PY_BENCH" --mode sync --lib limits-redispy "${pa[@]}"
  client py-sync "$round" "shardlimit spin_wait 100us" "$PY" "$PY_BENCH" --mode sync --lib shardlimit --spin-wait 100us "${pa[@]}"
  ga=(-redis "$URL" -redis-pid "$RPID" -total "$TOTAL" -sequential "$SEQ")
  client go-64 "$round" shardlimit "$GO_DIR/peers" -lib shardlimit "${ga[@]}"
  client go-64 "$round" redis_rate "$GO_DIR/peers" -lib redis_rate "${ga[@]}"
  client go-64 "$round" "shardlimit TransportThread" "$GO_DIR/peers" -lib shardlimit -transport thread "${ga[@]}"

  # Rust: `shardlimit bench` (100k keys, token bucket, never denied) against redis-benchmark
  # running a minimal hash token bucket script (bench/token_bucket_min.lua) on the same Redis
  want rust || continue
  cat >"$RUN/cfg.json" <<JSON
{"shards":[{"name":"bench","url":"$URL"}],"timeout_ms":1000,
 "policies":{"api":{"algorithm":"token_bucket","capacity":1000000000,"refill_per_sec":1000000}}}
JSON
  fresh
  r0=$(redis_cpu)
  out=$(cpu_child "$SL_CLI" bench --config "$RUN/cfg.json" --policy api --concurrency 64 --requests "$RUST_N" --keys 100000 --json)
  r1=$(redis_cpu)
  python3 -c '
import json, sys
lines = sys.argv[1].strip().splitlines()
d = json.loads(lines[0]); n = int(sys.argv[2])
if d["allowed"] != n:
    sys.exit("shardlimit bench: %d of %d decisions were Redis admissions (%s)" % (d["allowed"], n, lines[0]))
print(json.dumps({"shape": "rust", "round": int(sys.argv[3]), "label": "shardlimit bench",
  "fallbacks": d.get("fallbacks", 0) + d.get("errors", 0),
  "decisions_per_sec": d["decisions_per_sec"], "p50_us": d.get("p50_us"), "p99_us": d.get("p99_us"),
  "client_cpu_us": int(lines[-1].split()[1]) / n, "redis_cpu_us": (float(sys.argv[5]) - float(sys.argv[4])) / n,
  "redis_script_us": int(sys.argv[6]) / n, "decisions": n}))' "$out" "$RUST_N" "$round" "$r0" "$r1" "$(script_usec)" >>"$RESULTS"
  no_fallbacks "rust/shardlimit bench"
  fresh
  SHA=$(redis-cli -p "$PORT" -x SCRIPT LOAD <bench/token_bucket_min.lua)
  r0=$(redis_cpu)
  out=$(cpu_child redis-benchmark -p "$PORT" -P 16 -c 50 -n "$RUST_N" -r 100000 --csv EVALSHA "$SHA" 1 'tb:{__rand_int__}' 1000000000 1000000)
  r1=$(redis_cpu)
  python3 -c '
import sys, json
lines = sys.argv[1].strip().splitlines(); n = int(sys.argv[2])
rate = float([l for l in lines if l.startswith("\"EVALSHA")][-1].split(",")[1].strip("\""))
print(json.dumps({"shape": "rust", "round": int(sys.argv[3]), "label": "redis-benchmark -P16 -c50, minimal token bucket script",
  "decisions_per_sec": rate, "p50_us": None, "p99_us": None,
  "client_cpu_us": int(lines[-1].split()[1]) / n, "redis_cpu_us": (float(sys.argv[5]) - float(sys.argv[4])) / n,
  "redis_script_us": int(sys.argv[6]) / n, "decisions": n}))' "$out" "$RUST_N" "$round" "$r0" "$r1" "$(script_usec)" >>"$RESULTS"
  echo "   rust round $round: $(tail -2 "$RESULTS" | python3 -c 'import json,sys; print(" / ".join("%s %.0f/s" % (d["label"], d["decisions_per_sec"]) for d in map(json.loads, sys.stdin)))')"
done

# ---- HTTP: a trivial route with no limiter, shardlimit's middleware, the peers'
HPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# tree_cpu PID: CPU (µs) of PID and its children (gunicorn's workers)
tree_cpu() {
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    [ -r "/proc/$p/stat" ] && total=$(( total + $(awk '{print ($14+$15)*10000}' "/proc/$p/stat") ))
  done
  echo "$total"
}
http() { # http FRAMEWORK MODE ROUND CMD...
  local fw=$1 mode=$2 round=$3
  shift 3
  want "http-$fw" || return 0
  fresh
  taskset -c 0 "$@" >"$RUN/server.log" 2>&1 &
  SERVER_PID=$!
  local ok=
  for _ in $(seq 600); do # up to a minute: imports are slow on a loaded machine
    curl -fsS "http://127.0.0.1:$HPORT/" >/dev/null 2>&1 && { ok=1; break; }
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$ok" ] || { cat "$RUN/server.log" >&2; echo "$fw/$mode did not start" >&2; exit 1; }
  taskset -c 1 wrk -t1 -c64 -d1s "http://127.0.0.1:$HPORT/" >/dev/null # warm-up
  redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null # (Redis time of the measured requests)
  local c0 c1 out usec
  c0=$(tree_cpu "$SERVER_PID")
  out=$(taskset -c 1 wrk -t1 -c64 -d"${HTTP_SECS}s" "http://127.0.0.1:$HPORT/")
  c1=$(tree_cpu "$SERVER_PID")
  usec=$(script_usec)
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
  python3 -c '
import json, re, sys
out = sys.argv[1]
reqs = int(re.search(r"(\d+) requests in", out).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
errors = re.search(r"Socket errors: (.*)", out)
print(json.dumps({"shape": "http-" + sys.argv[2], "label": sys.argv[3], "round": int(sys.argv[4]),
  "req_per_sec": rps, "requests": reqs, "cpu_us_per_req": (int(sys.argv[6]) - int(sys.argv[5])) / reqs,
  "non_2xx": int(non2xx.group(1)) if non2xx else 0, "socket_errors": errors.group(1) if errors else "",
  "redis_script_us": int(sys.argv[7]) / reqs}))' \
    "$out" "$fw" "$mode" "$round" "$c0" "$c1" "$usec" >>"$RESULTS"
  # (shardlimit's apps answer a fallback with 503: on_error closed)
  no_fallbacks "http-$fw/$mode"
  echo "   $fw $mode round $round: $(tail -1 "$RESULTS" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.0f req/s, %.0f us CPU/req, Redis %.2f us/req%s" % (d["req_per_sec"], d["cpu_us_per_req"], d["redis_script_us"], ", %d non-2xx" % d["non_2xx"] if d["non_2xx"] else ""))')"
}
APPS=$root/bindings/python/bench
for round in $(seq "$ROUNDS"); do
  echo "== round $round of $ROUNDS: HTTP (wrk -c 64, ${HTTP_SECS}s, $(date -u +%T))"
  for mode in none shardlimit shardlimit-thread rlf erl; do
    http express "$mode" "$round" node bindings/node/bench/http.js --mode "$mode" --redis "$URL" --port "$HPORT"
  done
  for mode in none shardlimit peer; do
    http fastapi "$mode" "$round" env BENCH_MODE=$mode BENCH_REDIS=$URL "$VENV/bin/uvicorn" --app-dir "$APPS" \
      --host 127.0.0.1 --port "$HPORT" --no-access-log --log-level warning http_apps:fastapi_app
  done
  for mode in none shardlimit peer; do
    http flask "$mode" "$round" env BENCH_MODE=$mode BENCH_REDIS=$URL "$VENV/bin/gunicorn" --chdir "$APPS" \
      -w 4 -b "127.0.0.1:$HPORT" --log-level warning http_apps:flask_app
  done
done

# ---- scale out over 1-8 shards and Cluster primaries (scripts/bench-scale.sh, its own
# redis-servers): its section goes into $OUT, which bench/report.py keeps
if want scale; then
  echo "== scale out: 1, 2, 4, 8 shards and Cluster primaries ($(date -u +%T))"
  cleanup # (this run's Redis and servers: the scale bench pins its own to CPU 1)
  trap - EXIT
  SHARDLIMIT_BIN=$SL_CLI bash scripts/bench-scale.sh $( [ "$QUICK" = 1 ] && echo --quick ) \
    --rounds "$ROUNDS" --write "$OUT" | grep -E '^(round|memory|unbatched|connections|decisions not from Redis)'
fi

LOAD_AFTER=$(cat /proc/loadavg)
echo "== load after: $LOAD_AFTER"
python3 bench/report.py "$RESULTS" "$OUT" \
  --meta "date=$(date -u +%FT%TZ)" --meta "quick=$QUICK" --meta "rounds=$ROUNDS" \
  --meta "load_before=$LOAD_BEFORE" --meta "load_after=$LOAD_AFTER" \
  --meta "artifacts=$ARTIFACTS" --meta "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- core bindings cli || echo +changes)" \
  --meta "cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs" \
  --meta "redis=$REDIS_VERSION" --meta "node=$(node --version)" --meta "python=$( [ -x "$PY" ] && "$PY" -c 'import sys; print(sys.version.split()[0])')" \
  --meta "go=$(go env GOVERSION)" --meta "go_redis=$GO_REDIS" --meta "redis_rate=$REDIS_RATE" \
  --meta "total=$TOTAL" --meta "sequential=$SEQ" --meta "py_n=$PYN" --meta "py_async_n=$PYAN" --meta "http_secs=$HTTP_SECS" --meta "rust_n=$RUST_N" \
  --lock "$LOCK" --criterion "$CRIT" \
  $( [ "$OUT" = docs/benchmarks.md ] && [ "$QUICK" = 0 ] && [ -z "$ONLY" ] && echo --readme README.md )
echo "== wrote $OUT"
