#!/usr/bin/env bash
# The main job (`make demo`): start three local Redis shards, then run a Rust, a Python, a
# Node, a Go and a Java worker AT THE SAME TIME against the same keys and policies, and show
# that together they admitted exactly each key's limit. Builds first (cached on reruns).
# Without redis-server (and no way to install it) it runs on the in-memory engine instead,
# in one process (the Rust worker, several workers sharing one limiter), and says so.
#
#   make demo                      # or: bash scripts/demo.sh
#   DEMO_REQUESTS=4800 make demo   # checks per worker (default 2400)
#   DEMO_ENGINE=memory make demo   # what happens without redis-server: the in-memory engine
#
# The builds: ONE `cargo build --profile demo` (unoptimized, no debug info: the workers make
# ~10k checks, so compile time is what counts) of everything the demo runs, so the shared
# dependencies compile once: the CLI, the Rust worker, the Python extension, the Node addon,
# libshardlimit for Go and the JNI library, all in target/demo; then `go build` of the Go
# worker, and the Java package's jar as scripts/dist-java.sh lays it out (`mvn package` of
# bindings/java with the demo's JNI library under natives/<platform>/, loaded from the jar as
# a user's JVM loads it). No venv, pip, maturin, npm or napi: the Python worker imports the
# package assembled in target/demo/python, the Node worker loads
# target/demo/node/shardlimit.node. (The release packages are what scripts/test-python.sh,
# scripts/test-node.sh and scripts/test-java.sh build and test.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh

REQUESTS=${DEMO_REQUESTS:-2400}   # checks per worker
CONCURRENCY=16                    # concurrent callers per worker
KEYS=8                            # user:0..7 under each policy
POLICIES=billing,demo_daily,demo_burst
OUT=$(target_dir)/demo            # the demo's cargo profile (honours CARGO_TARGET_DIR)

step() { printf '\n== %s\n' "$*"; }

WORK=$(mktemp -d)
PIDS=()
GO_BUILD=
JAVA_BUILD=
cleanup() {
  exec 3>&- 2>/dev/null || true
  for p in "${PIDS[@]}" $GO_BUILD $JAVA_BUILD; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------- builds
step "builds (cached on reruns)"
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: install Rust with rustup" >&2; exit 1; }
if ! command -v python3 >/dev/null 2>&1 && ! apt_install python3; then
  echo "python3 not found: the demo needs it (for its config and its table)" >&2
  exit 1
fi
PY=$(python3 -c 'import sys; print(sys.executable)') # the interpreter, not a pyenv shim

# What to build depends on the tools at hand, not on the engine: the same crates in one
# invocation get the same features, so switching to DEMO_ENGINE=memory and back rebuilds
# nothing. --no-default-features: without `tls` (rediss://; the demo's shards are local),
# which spares compiling rustls.
crates=(shardlimit-cli shardlimit-demo-worker)
features=()
LANGS=(rust)
if "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
  crates+=(shardlimit-python)
  features+=(--features shardlimit-python/extension-module) # its other default feature
  LANGS+=(python)
else
  echo "python3 is older than 3.9: no Python worker" >&2
fi
if command -v node >/dev/null 2>&1; then
  crates+=(shardlimit-node)
  LANGS+=(node)
else
  echo "node not available: no Node worker" >&2
fi
if ensure_go >&2; then
  crates+=(shardlimit-c)
  LANGS+=(go)
else
  echo "go not available: no Go worker" >&2
fi
# Java: a JDK (17 or newer) and Maven, from Debian when missing and root
if { command -v javac && command -v mvn; } >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless maven >&2; then
  crates+=(shardlimit-java)
  LANGS+=(java)
else
  echo "javac or mvn not available: no Java worker" >&2
fi
echo "cargo build --profile demo --no-default-features: ${crates[*]}"
# PYO3_*: what maturin tells pyo3 (which interpreter; an extension module, no libpython)
PYO3_PYTHON="$PY" PYO3_BUILD_EXTENSION_MODULE=1 \
  cargo build --profile demo --quiet --no-default-features "${features[@]}" "${crates[@]/#/--package=}"
SL=$OUT/shardlimit

# On the in-memory engine only the Rust worker runs (one process, one limiter).
if [ "${DEMO_ENGINE:-}" != memory ] && ensure_redis 2>/dev/null; then ENGINE=redis; else ENGINE=memory; LANGS=(rust); fi
for lang in "${LANGS[@]}"; do
  case $lang in
    python)
      # the package as maturin lays it out: the Python sources plus the extension module,
      # named as in an abi3 wheel
      rm -rf "$OUT/python"
      mkdir -p "$OUT/python"
      cp -R bindings/python/python/shardlimit "$OUT/python/"
      cp "$OUT/lib_shardlimit.so" "$OUT/python/shardlimit/_shardlimit.abi3.so"
      echo "python package: $OUT/python/shardlimit (imported with PYTHONPATH=$OUT/python)"
      ;;
    node)
      # Node loads an addon by its .node extension (as napi build names it)
      mkdir -p "$OUT/node"
      cp "$OUT/libshardlimit_node.so" "$OUT/node/shardlimit.node"
      echo "node addon: $OUT/node/shardlimit.node (loaded with SHARDLIMIT_NATIVE_LIBRARY)"
      ;;
    go)
      # in the background while the shards start. The binding links through pkg-config:
      # a shardlimit.pc naming $OUT, and -tags shardlimit_dynamic (libshardlimit.so, which
      # LD_LIBRARY_PATH makes the worker load) rather than linking the unoptimized archive.
      bindings/c/gen-pkgconfig.sh "$OUT" "$root/include" "$OUT/pkgconfig" >/dev/null
      # the name the worker asks the loader for: the library's SONAME (bindings/c/build.rs)
      major=$(workspace_version); major=${major%%.*}
      ln -sf libshardlimit.so "$OUT/libshardlimit.so.$major"
      echo "go build ./cmd/demo-worker (cgo, against $OUT/libshardlimit.so; in the background)"
      # GOCACHE: its own, as the go command does not rerun pkg-config to key its cache (a
      # package cached by another build would link that build's -L)
      PKG_CONFIG_PATH="$OUT/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" GOCACHE="$OUT/go-cache" \
        go -C bindings/go build -buildvcs=false -tags shardlimit_dynamic -o "$OUT/go-demo-worker" ./cmd/demo-worker >"$WORK/go-build.log" 2>&1 &
      GO_BUILD=$!
      ;;
    java)
      # in the background too: the jar (classes and natives/<platform>/libshardlimit_jni.so,
      # as in dist/java), then the worker's class against it. Maven resolves its plugins and
      # the optional Servlet and Spring APIs into ~/.m2 on the first run.
      case "$(uname -m)" in x86_64 | amd64) jarch=x86_64 ;; aarch64 | arm64) jarch=aarch64 ;; *) jarch=$(uname -m) ;; esac
      JAVA_JAR="$OUT/java/build/shardlimit-$(workspace_version).jar"
      jni="$OUT/java/natives/linux-$jarch/libshardlimit_jni.so"
      if [ -f "$JAVA_JAR" ] && [ -f "$OUT/java/classes/Worker.class" ] && cmp -s "$OUT/libshardlimit_jni.so" "$jni" &&
        [ -z "$(find bindings/java/pom.xml bindings/java/src/main examples/demo/Worker.java -newer "$JAVA_JAR" -print -quit)" ]; then
        echo "java jar: $JAVA_JAR (up to date)"
      else
        rm -rf "$OUT/java/natives" "$OUT/java/classes"
        mkdir -p "$(dirname "$jni")"
        cp "$OUT/libshardlimit_jni.so" "$jni"
        echo "mvn package of bindings/java (natives from $OUT), javac examples/demo/Worker.java (in the background)"
        { mvn -B -q -f bindings/java/pom.xml package -DskipTests -Dshardlimit.natives.dir="$OUT/java/natives" \
            -Dshardlimit.build.dir="$OUT/java/build" &&
            javac -d "$OUT/java/classes" -cp "$JAVA_JAR" examples/demo/Worker.java && touch "$JAVA_JAR"; } >"$WORK/java-build.log" 2>&1 &
        JAVA_BUILD=$!
      fi
      ;;
  esac
done

# ---------------------------------------------------------------------------- shards
t0=$(date +%s.%N)
step "shards"
if [ $ENGINE = redis ]; then
  for port in 6391 6392 6393; do
    if redis-cli -h 127.0.0.1 -p $port ping >/dev/null 2>&1; then
      echo "port $port is already in use by a Redis; stop it first (the demo starts its own shards)" >&2
      exit 1
    fi
    mkdir -p "$WORK/$port"
    redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$port" >"$WORK/$port.log" 2>&1 &
    PIDS+=($!)
  done
  for port in 6391 6392 6393; do
    for _ in $(seq 200); do redis-cli -h 127.0.0.1 -p $port ping >/dev/null 2>&1 && break; sleep 0.05; done
    redis-cli -h 127.0.0.1 -p $port ping >/dev/null || { echo "redis-server on $port did not start" >&2; cat "$WORK/$port.log" >&2; exit 1; }
  done
  echo "started 3 Redis shards on 127.0.0.1:6391-6393 (engine: redis)"
else
  [ "${DEMO_ENGINE:-}" = memory ] && echo "DEMO_ENGINE=memory: not starting Redis" ||
    echo "redis-server is not available (and cannot be installed here):"
  echo "running on the EMBEDDED IN-MEMORY ENGINE, in ONE PROCESS (the Rust worker, 4 workers sharing one limiter)"
fi

# The demo's config: shard-config.json's shards and policies, plus two policies whose totals
# are exact for the whole run: a fixed window of one day and a token bucket refilling one
# token per 1000 s. (login's one-minute window could end mid-run; api refills 10/s.) The
# per-call deadline is raised from 50 ms: 4 busy processes share 2 cores here, and a
# timeout would be decided by on_error instead of by Redis.
"$PY" - shard-config.json "$ENGINE" > "$WORK/demo-config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["description"] = "make demo: shard-config.json plus two long-window policies"
cfg["timeout_ms"] = 1000
cfg["policies"]["demo_daily"] = {"algorithm": "fixed_window", "limit": 50, "window": "1d"}
cfg["policies"]["demo_burst"] = {"algorithm": "token_bucket", "capacity": 30, "refill_per_sec": 0.001}
if sys.argv[2] == "memory":
    cfg.pop("shards", None)
print(json.dumps(cfg, indent=2))
PY
CONFIG="$WORK/demo-config.json"
$SL config validate "$CONFIG" >/dev/null

step "routing: which shard owns which key (jump hash of xxh64; {tags} keep keys together)"
$SL route --config "$CONFIG" user:0 user:1 user:2 user:3 '{acme}:user:1' '{acme}:user:2'

step "policy \"login\" (fixed_window, 5 per minute): 7 attempts by user:alice, from the CLI"
if [ $ENGINE = memory ]; then
  echo "(skipped: each CLI call is its own process, and the in-memory engine lives in one process)"
else
printf '%-8s %-8s %-10s %-14s %s\n' attempt allowed remaining retry_after_ms shard
for i in $(seq 7); do
  out=$($SL check --config "$CONFIG" --policy login user:alice || true)
  "$PY" -c '
import json, sys
d = json.loads(sys.argv[2]); s = d["shard"]
print("%-8s %-8s %-10s %-14s %s" % (sys.argv[1], str(d["allowed"]).lower(), d["remaining"], d["retry_after_ms"] if d["retry_after_ms"] is not None else "-", s["name"] if s else "memory"))' "$i" "$out"
done
fi

# ---------------------------------------------------------------------------- workers
common=(--requests "$REQUESTS" --concurrency "$CONCURRENCY" --keys "$KEYS" --policies "$POLICIES")
if [ $ENGINE = redis ]; then
  step "${#LANGS[@]} workers at once (${LANGS[*]}), $REQUESTS checks each, $CONCURRENCY concurrent callers each, over ${KEYS} keys x {billing, demo_daily, demo_burst}"
else
  step "4 workers in one process (in-memory engine), $REQUESTS checks each, over ${KEYS} keys x {billing, demo_daily, demo_burst}"
fi
if [ -n "$GO_BUILD" ]; then
  wait "$GO_BUILD" || { cat "$WORK/go-build.log" >&2; echo "go build of the Go worker failed" >&2; exit 1; }
  GO_BUILD=
fi
if [ -n "$JAVA_BUILD" ]; then
  wait "$JAVA_BUILD" || { cat "$WORK/java-build.log" >&2; echo "the build of the Java worker failed" >&2; exit 1; }
  JAVA_BUILD=
fi
mkfifo "$WORK/start"
i=0
for lang in "${LANGS[@]}"; do
  case $lang in
    rust)
      if [ $ENGINE = redis ]; then cmd=("$OUT/shardlimit-demo-worker" --instance 0)
      else cmd=("$OUT/shardlimit-demo-worker" --instance 0 --threads 4); fi ;;
    python) cmd=(env PYTHONPATH="$OUT/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" examples/demo/worker.py --instance 1) ;;
    node) cmd=(env SHARDLIMIT_NATIVE_LIBRARY="$OUT/node/shardlimit.node" node examples/demo/worker.mjs --instance 2) ;;
    go) cmd=(env LD_LIBRARY_PATH="$OUT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$OUT/go-demo-worker" --instance 3) ;;
    # (the library extracted from the jar into the demo's scratch folder)
    # (C1 only and the serial collector: 2400 checks need no more compiler, and the CPU is shared)
    java) cmd=(java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC --enable-native-access=ALL-UNNAMED -Djava.io.tmpdir="$WORK" -cp "$JAVA_JAR:$OUT/java/classes" Worker --instance 4) ;;
  esac
  # each worker connects, prints "ready", then waits for the start fifo to close
  "${cmd[@]}" --config "$CONFIG" "${common[@]}" --barrier <"$WORK/start" >"$WORK/$lang.json" 2>"$WORK/$lang.err" &
  PIDS+=($!)
  WPID[$i]=$!
  i=$((i + 1))
done
exec 3>"$WORK/start" # lets every worker's open of the fifo complete
n=${#LANGS[@]}
for _ in $(seq 1200); do # at most 60 s for every worker to load and connect
  ready=0
  for lang in "${LANGS[@]}"; do grep -qx ready "$WORK/$lang.err" 2>/dev/null && ready=$((ready + 1)); done
  [ $ready = "$n" ] && break
  for p in "${WPID[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.05
done
if [ "$ready" != "$n" ]; then
  for lang in "${LANGS[@]}"; do echo "--- $lang worker:" >&2; tail -5 "$WORK/$lang.err" >&2; done
  echo "not every worker started" >&2
  exit 1
fi
tw=$(date +%s.%N)
exec 3>&- # start: every worker sees end of input at once

progress_line() {
  local line="" lang last
  for lang in "${LANGS[@]}"; do
    last=$(grep '^progress ' "$WORK/$lang.err" 2>/dev/null | tail -1 | cut -d' ' -f2 || true)
    line+=$(printf '  %-6s %11s' "$lang" "${last:-0}")
  done
  echo "$line"
}
prev=""
while :; do
  alive=0
  for p in "${WPID[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  cur=$(progress_line)
  [ "$cur" != "$prev" ] && echo "$cur" && prev=$cur
  [ $alive = 0 ] && break
  sleep 0.1
done
failed=0
i=0
for lang in "${LANGS[@]}"; do
  if ! wait "${WPID[$i]}"; then
    echo "the $lang worker failed:" >&2
    tail -5 "$WORK/$lang.err" >&2
    failed=1
  fi
  i=$((i + 1))
done
[ $failed = 0 ] || exit 1
te=$(date +%s.%N)

# ---------------------------------------------------------------------------- table
step "result"
"$PY" - "$CONFIG" "$ENGINE" "$tw" "$te" "$t0" "${LANGS[@]/#/$WORK/}" <<'PY'
import json, math, sys
cfg = json.load(open(sys.argv[1]))
engine, t_start, t_end, t0 = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
rows = []
for path in sys.argv[6:]:
    for line in open(path + ".json"):
        if line.strip():
            rows.append(json.loads(line))
label = lambda r: r["language"] if engine == "redis" else f"{r['language']}#{r['instance'] + 1}"
ok = True

print(f"{'worker':<10} {'sent':>6} {'allowed':>8} {'denied':>7} {'fallback':>9} {'errors':>7} {'time':>8}")
for r in rows:
    print(f"{label(r):<10} {r['sent']:>6} {r['allowed']:>8} {r['denied']:>7} {r['fallback']:>9} {r['errors']:>7} {r['elapsed_ms']:>6}ms")
    if r["fallback"] or r["errors"] or r["allowed"] + r["denied"] != r["sent"]:
        ok = False
tot = {k: sum(r[k] for r in rows) for k in ("sent", "allowed", "denied", "fallback", "errors")}
print(f"{'total':<10} {tot['sent']:>6} {tot['allowed']:>8} {tot['denied']:>7} {tot['fallback']:>9} {tot['errors']:>7}")

def expected(policy):
    p = cfg["policies"][policy]
    a = p["algorithm"]
    if a == "sliding_log":
        return p["limit"], f"sliding_log {p['limit']}/{p['window']}"
    if a == "fixed_window":
        assert p["window"] == "1d"
        # a fixed window is aligned to the epoch: a run across midnight UTC gets two windows
        windows = math.floor(t_end / 86400) - math.floor(t_start / 86400) + 1
        return p["limit"] * windows, f"fixed_window {p['limit']}/{p['window']}"
    if a == "token_bucket":
        assert t_end - t_start < 1 / p["refill_per_sec"], "the run outlasted one refill"
        return p["capacity"], f"token_bucket cap {p['capacity']}, +1 per {1 / p['refill_per_sec']:.0f}s"
    raise SystemExit(f"no exact expectation for {a}")

print()
names = [label(r) for r in rows]
print(f"{'policy/key':<18} " + " ".join(f"{n:>7}" for n in names) + f" {'total':>6} {'limit':>6}  algorithm")
for key in rows[0]["per_key"]:
    policy = key.split("/")[0]
    want, algo = expected(policy)
    got = sum(r["per_key"].get(key, 0) for r in rows)
    mark = "exact" if got == want else "WRONG"
    ok &= got == want
    print(f"{key:<18} " + " ".join(f"{r['per_key'].get(key, 0):>7}" for r in rows) + f" {got:>6} {want:>6}  {algo}  {mark}")
want_total = sum(expected(k.split("/")[0])[0] for k in rows[0]["per_key"])
print()
where = "3 Redis shards" if engine == "redis" else "the in-memory engine, one process"
print(f"{len(rows)} workers on {where}: {tot['allowed']} admitted of {tot['sent']}, "
      f"expected exactly {want_total}: {'EXACT' if ok and tot['allowed'] == want_total else 'WRONG'}")
print(f"workers ran {t_end - t_start:.2f}s; the demo took {t_end - t0:.1f}s after the builds")
sys.exit(0 if ok and tot["allowed"] == want_total else 1)
PY
