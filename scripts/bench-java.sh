#!/usr/bin/env bash
# `make bench-java`: the Java package (dist/java's jar) against Bucket4j over Lettuce (the
# versions of bindings/java/bench/pom.xml), on one Redis, written to the Java section of
# docs/benchmarks.md (the rest of the file is left as it is).
#   bash scripts/bench-java.sh [--quick] [--out FILE]
# --quick: one short round (checks that the script works; its numbers mean little).
#
# As scripts/bench-peers.sh does for the other languages: one redis-server pinned to CPU 1,
# every client JVM pinned to CPU 0 (taskset); each shape alternates the libraries, one JVM per
# library and round (the order swapped each round), three rounds, medians reported; a JIT
# warm-up at the same load before each measurement. Only decisions that came from Redis are
# counted: a run with any fallback (a shardlimit decision whose source is not Redis) or error
# fails. Then a bounded correctness round: 3000 checks, 64 in flight, on one key of a bucket of
# 1000 that refills nothing meanwhile; shardlimit must admit exactly 1000 (the run fails
# otherwise) and Bucket4j's count is reported. About 3 minutes (--quick: 1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh

QUICK=0
OUT=docs/benchmarks.md
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--quick] [--out FILE]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$QUICK" = 1 ]; then ROUNDS=1 WARM=1 SECS=2 SEQ=1000; else ROUNDS=3 WARM=3 SECS=5 SEQ=5000; fi
[ "$(nproc)" -ge 2 ] || { echo "needs two CPUs (Redis on one, the client on the other)" >&2; exit 1; }

ensure_redis
command -v javac >/dev/null 2>&1 || apt_install openjdk-17-jdk-headless
command -v mvn >/dev/null 2>&1 || apt_install maven
command -v taskset >/dev/null 2>&1 || apt_install util-linux

version=$(workspace_version)
jar="${DIST_DIR:-$root/dist}/java/shardlimit-$version.jar"
[ -f "$jar" ] || scripts/dist-java.sh
SCRATCH=$(target_dir)/bench-java
rm -rf "$SCRATCH/run" && mkdir -p "$SCRATCH/run"
RUN=$SCRATCH/run
RESULTS=$RUN/results.jsonl
: >"$RESULTS"

echo "== Bucket4j and Lettuce (bindings/java/bench/pom.xml) and the bench's class"
mvn -B -q -f bindings/java/bench/pom.xml dependency:build-classpath -Dmdep.outputFile="$RUN/peers.cp"
CP="$jar:$(cat "$RUN/peers.cp")"
javac -nowarn -d "$RUN/classes" -cp "$CP" bindings/java/bench/Bench.java
CP="$RUN/classes:$CP"
JAVA_VERSION=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.runtime.version = //p')
LOAD_BEFORE=$(cat /proc/loadavg)
echo "== load before: $LOAD_BEFORE"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=redis://127.0.0.1:$PORT
taskset -c 1 redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$RUN" \
  --logfile "$RUN/redis.log" &
RPID=$!
trap 'kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
REDIS_VERSION=$(redis-cli -p "$PORT" INFO server | sed -n 's/^redis_version:\(.*\)\r$/\1/p')

# bench SHAPE ROUND LIB ARGS...: one JVM pinned to CPU 0; its JSON line, with the shape and
# round, appended to the results
bench() {
  local shape=$1 round=$2 lib=$3 line
  shift 3
  redis-cli -p "$PORT" FLUSHALL >/dev/null
  line=$(taskset -c 0 java -Xmx512m --enable-native-access=ALL-UNNAMED -Djava.io.tmpdir="$RUN" -cp "$CP" \
    Bench --lib "$lib" --redis "$URL" --redis-pid "$RPID" "$@" 2>"$RUN/$shape-$lib-$round.err" | tail -1) ||
    { cat "$RUN/$shape-$lib-$round.err" >&2; echo "$shape/$lib round $round failed" >&2; exit 1; }
  python3 -c '
import json, sys
d = json.loads(sys.argv[1]); d.update(shape=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(d))' \
    "$line" "$shape" "$round" >>"$RESULTS"
  tail -1 "$RESULTS" | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d["mode"] == "exact":
    print("   %s %s: admitted %d of %d (limit %d), %d errors, %d fallbacks" % (d["shape"], d["lib"], d["admitted"], d["requests"], d["limit"], d["errors"], d["fallbacks"]))
else:
    print("   %s round %d %s: %.0f/s, client CPU %.1f us/decision, Redis CPU %.1f us, scripts %.2f us in %.3f calls/decision, p50 %.0f us, p99 %.0f us, %d errors, %d fallbacks" % (
        d["shape"], d["round"], d["lib"], d["decisions_per_sec"], d["client_cpu_us"], d["redis_cpu_us"], d["redis_script_us"],
        d["script_calls_per_decision"], d["p50_us"], d["p99_us"], d["errors"], d["fallbacks"]))
n = d["errors"] + d["fallbacks"]
if n:
    sys.exit("%s/%s: %d checks did not get a decision from Redis (errors or fallbacks): the run fails" % (d["shape"], d["lib"], n))'
}

t=(--mode throughput --warmup-secs "$WARM" --secs "$SECS")
for round in $(seq "$ROUNDS"); do
  echo "== round $round of $ROUNDS ($(date -u +%T))"
  # the order alternates: neither library always runs first
  if [ $((round % 2)) = 1 ]; then libs=(shardlimit bucket4j); else libs=(bucket4j shardlimit); fi
  for lib in "${libs[@]}"; do bench keys-1000 "$round" "$lib" "${t[@]}" --keys 1000 --sequential "$SEQ"; done
  for lib in "${libs[@]}"; do bench hot-key "$round" "$lib" "${t[@]}" --keys 1; done
done
echo "== exact totals: 3000 checks, 64 in flight, one key, a bucket of 1000"
for lib in shardlimit bucket4j; do bench exact 1 "$lib" --mode exact --limit 1000 --requests 3000; done
LOAD_AFTER=$(cat /proc/loadavg)
echo "== load after: $LOAD_AFTER"

python3 - "$RESULTS" "$OUT" "$(date -u +%FT%TZ)" "$QUICK" "$ROUNDS" "$LOAD_BEFORE" "$LOAD_AFTER" \
  "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- core bindings || echo +changes)" \
  "$REDIS_VERSION" "$JAVA_VERSION" "$WARM" "$SECS" "$SEQ" \
  "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs" <<'PY'
import json, statistics, sys
from pathlib import Path
(results, out, date, quick, rounds, load0, load1, commit, redis, java, warm, secs, seq, cpu) = sys.argv[1:]
rows = [json.loads(l) for l in open(results) if l.strip()]
med = lambda shape, lib, k: statistics.median(r[k] for r in rows if r["shape"] == shape and r["lib"] == lib)
ver = {r["lib"]: r["version"] for r in rows}
exact = {r["lib"]: r for r in rows if r["mode"] == "exact"}

L = []
w = L.append
w("## Java: shardlimit against Bucket4j over Lettuce (`make bench-java`)")
w("")
w(f"{date}, commit {commit}{' (QUICK: one short round, the numbers mean little)' if quick == '1' else ''}; "
  f"{cpu}; Redis {redis} pinned to CPU 1, each client JVM (Java {java}, `-Xmx512m`) pinned to CPU 0. "
  f"**The machine was shared with other work while this ran** (load average {load0.split()[0]} before, "
  f"{load1.split()[0]} after, on 2 CPUs): the absolute figures are low and noisy; the libraries ran "
  f"alternately, one JVM per library and round, {rounds} round(s), medians shown, so the ratios are the "
  "figures to read.")
w("")
w(f"- {ver['shardlimit']} (the jar of `dist/java`, async `checkAsync`, sequential `check`) against "
  f"{ver['bucket4j']} (`Bucket4jLettuce.casBasedBuilder`, async `tryConsume` of one cached proxy per key, "
  "sequential the blocking proxy's `tryConsume`, expiry `basedOnTimeForRefillingBucketUpToMax`).")
w("- The same policy in both: a token bucket of 10^9 refilling 10^9 per hour, so every check is admitted "
  f"and each is one decision. Each JVM warms up for {warm} s at the measured load (JIT, connections, "
  f"scripts), then measures {secs} s with 64 checks in flight; on 1000 keys it then makes {seq} "
  "sequential blocking checks for p50/p99.")
w("- Client CPU: the JVM's, every thread (GC and JIT included), per decision of the measured phase. "
  "Redis CPU: redis-server's own (`/proc`), per decision, everything it did (network, parsing, scripts). "
  "From `INFO commandstats` (reset after the warm-up): the time of the script calls per decision "
  "(EVAL/EVALSHA, which includes the commands they run; Bucket4j's GET before each compare-and-swap "
  "is outside it), how many script calls per decision (Bucket4j: compare-and-swap attempts; shardlimit: "
  "below 1 when one script call decides many checks) and how many commands Redis ran per decision "
  "(the scripts' own included). Every decision counted came from Redis: a run with a fallback or an "
  "error fails.")
w("")
w("| shape | library | decisions/s | client CPU µs/decision | Redis CPU µs/decision | Redis script µs/decision | script calls/decision | Redis commands/decision | sequential p50 µs | p99 µs |")
w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for shape, label in (("keys-1000", "64 in flight, 1000 keys"), ("hot-key", "64 in flight, one hot key")):
    for lib in ("shardlimit", "bucket4j"):
        seqcols = (f"{med(shape, lib, 'p50_us'):.0f} | {med(shape, lib, 'p99_us'):.0f}"
                   if shape == "keys-1000" else "– | –")
        w(f"| {label} | {ver[lib].split(' + ')[0]} | {med(shape, lib, 'decisions_per_sec'):,.0f} | "
          f"{med(shape, lib, 'client_cpu_us'):.1f} | {med(shape, lib, 'redis_cpu_us'):.1f} | "
          f"{med(shape, lib, 'redis_script_us'):.2f} | {med(shape, lib, 'script_calls_per_decision'):.3f} | "
          f"{med(shape, lib, 'redis_commands_per_decision'):.2f} | {seqcols} |")
w("")
r = lambda shape, k: med(shape, "shardlimit", k) / med(shape, "bucket4j", k)
tput1k, cpu1k, hot = r("keys-1000", "decisions_per_sec"), r("keys-1000", "client_cpu_us"), r("hot-key", "decisions_per_sec")
ex = exact["shardlimit"]
targets = [
    ("decisions/s on 1000 keys, shardlimit / Bucket4j", f"{tput1k:.2f}x", ">= 1.5x", tput1k >= 1.5),
    ("client CPU per decision on 1000 keys, shardlimit / Bucket4j", f"{cpu1k:.2f}x", "<= 0.5x", cpu1k <= 0.5),
    ("decisions/s on one hot key, shardlimit / Bucket4j", f"{hot:.1f}x", ">= 10x", hot >= 10),
    (f"exact totals: admitted of {ex['requests']} checks (64 in flight, one key, a bucket of {ex['limit']})",
     f"shardlimit {ex['admitted']}, Bucket4j {exact['bucket4j']['admitted']}", f"{ex['limit']}",
     ex["admitted"] == ex["limit"]),
]
w("| target | measured | wanted | met |")
w("| --- | ---: | ---: | :---: |")
for name, got, want, ok in targets:
    w(f"| {name} | {got} | {want} | {'yes' if ok else 'no'} |")
w("")

# only this section of the file is rewritten: from its heading to the next `## ` (or the end)
path = Path(out)
lines = path.read_text().splitlines() if path.exists() else []
head = L[0]
start = next((i for i, l in enumerate(lines) if l.startswith("## Java: ")), None)
if start is None:
    while lines and not lines[-1].strip():
        lines.pop()
    new = lines + ([""] if lines else []) + L
else:
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    new = lines[:start] + L + lines[end:]
path.write_text("\n".join(new).rstrip("\n") + "\n")
print("\n".join(L[6:]))
if ex["admitted"] != ex["limit"]:
    sys.exit(f"shardlimit admitted {ex['admitted']} of a limit of {ex['limit']}: not exact")
PY
echo "== wrote the Java section of $OUT"
