#!/usr/bin/env python3
"""Scale-out: decisions/s and Redis's own work per decision with 1, 2, 4 and 8 shards, as
client-side shards (separate redis-servers routed by jump hash) and as a Redis Cluster of
the same number of primaries (slots split evenly, no replicas), all on 127.0.0.1.

Run by scripts/bench-scale.sh (`make bench-scale`), which builds the CLI and passes it:

    python3 bench/scale.py --cli PATH [--sizes 1,2,4,8] [--algorithms a,b] [--rounds 3]
        [--per-shard 15000] [--per-shard-concurrency 16] [--concurrency N] [--keys-per-shard 5000]
        [--write docs/benchmarks.md]

The work grows with the shards: a run with n shards makes `per-shard × n` decisions from
`per-shard-concurrency × n` concurrent callers (`shardlimit bench`, one process), over
`keys-per-shard × n` keys, so every shard sees the same load at every size; `--concurrency
N` fixes the callers instead (the same traffic spread thinner over more shards).

Every redis-server is started here (its PID recorded) and stopped here by that PID. Redis
runs pinned to CPU 1 and the client to CPU 0 when the machine has two CPUs or more (as
`make bench` does). Figures per decision, read from Redis and from /proc:

- Redis CPU: utime+stime of every redis-server of the run (/proc/<pid>/stat) over the run,
  ÷ decisions: what the Redis processes spent (commands, network I/O, the cluster bus,
  timers): the figure that sizes a fleet.
- command µs: INFO commandstats usec of the commands that decided (the scripts, summed over
  the servers) ÷ decisions; calls: those commands' calls ÷ decisions (below 1: concurrent
  checks of one shard share a script call).
- busiest: the busiest server's command time ÷ the mean over the servers (1.00: even).
- not from Redis: decisions that were fallbacks or errors (every policy is `on_error:
  error` with limits far above the traffic, so every decision must be a Redis admission);
  any fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ALGORITHMS = {
    "fixed_window": {"algorithm": "fixed_window", "limit": 1000000000, "window": "1h"},
    "sliding_window": {"algorithm": "sliding_window", "limit": 1000000000, "window": "1h"},
    "sliding_log": {"algorithm": "sliding_log", "limit": 1000000, "window": "1h"},
    "token_bucket": {"algorithm": "token_bucket", "capacity": 1000000000, "refill_per_sec": 1000000},
    "leaky_bucket": {"algorithm": "leaky_bucket", "capacity": 1000000000, "leak_per_sec": 1000000},
    "concurrency": {"algorithm": "concurrency", "max": 1000000, "lease_ttl": "1h"},
}
# commands that are the bench's own or the client's set-up, not a decision's
ADMIN = {"info", "config", "flushall", "script", "ping", "client", "hello", "select", "command",
         "auth", "cluster", "readonly", "memory", "dbsize", "scan", "zcard", "type", "debug"}
SCRIPTS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}
TICK = os.sysconf("SC_CLK_TCK")


def free_port(cluster: bool = False) -> int:
    """A free loopback port; for a cluster node one whose bus port (+10000) is free too."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if not cluster:
            return port
        if port > 55535:
            continue
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
        finally:
            b.close()


def cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout


class Server:
    """One redis-server this script started; stopped by its PID."""

    def __init__(self, home: Path, pin: list[str], cluster: bool) -> None:
        self.port = free_port(cluster)
        self.dir = Path(tempfile.mkdtemp(dir=home))
        args = [*pin, "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000"]
        self.log = open(self.dir / "log", "w")
        # (taskset execs redis-server: the PID is the server's)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            try:
                if cli(self.port, "ping").strip() == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"redis-server on {self.port} did not start: "
                                 + (self.dir / "log").read_text()[-2000:])
            time.sleep(0.05)

    def cpu_us(self) -> float:
        f = open(f"/proc/{self.proc.pid}/stat").read()
        fields = f[f.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) * 1e6 / TICK

    def script_stats(self) -> tuple[int, int, int]:
        """(script calls, their usec, every command's calls, those run inside scripts
        included) since the last RESETSTAT. Only the scripts' usec: the commands a script
        runs are counted in commandstats too, and their time is inside the script's."""
        calls = usec = allcalls = 0
        for name, c, u in re.findall(r"^cmdstat_([^:]+):calls=(\d+),usec=(\d+)",
                                     cli(self.port, "INFO", "commandstats"), re.M):
            if name.split("|")[0] in ADMIN:
                continue
            allcalls += int(c)
            if name in SCRIPTS:
                calls += int(c)
                usec += int(u)
        return calls, usec, allcalls

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_set(n: int, cluster: bool, home: Path, pin: list[str]) -> list[Server]:
    servers: list[Server] = []
    try:
        for _ in range(n):
            servers.append(Server(home, pin, cluster))
        if cluster:
            # slots split evenly, every node meets the first, no replicas
            per = 16384 // n
            for i, s in enumerate(servers):
                lo, hi = i * per, (16383 if i == n - 1 else (i + 1) * per - 1)
                cli(s.port, "CLUSTER", "ADDSLOTSRANGE", str(lo), str(hi))
                if i:
                    cli(s.port, "CLUSTER", "MEET", "127.0.0.1", str(servers[0].port))
            deadline = time.time() + 60
            while not all("cluster_state:ok" in cli(s.port, "CLUSTER", "INFO")
                          and f"cluster_known_nodes:{n}" in cli(s.port, "CLUSTER", "INFO")
                          for s in servers):
                if time.time() > deadline:
                    raise SystemExit(f"the {n}-node cluster did not become ok")
                time.sleep(0.1)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


# the memory phase's buckets refill slowly: a bucket's key lives as long as it takes to
# refill (at 10^6 a second, a microsecond after a check)
SLOW = {"token_bucket": {"capacity": 1000, "refill_per_sec": 0.001},
        "leaky_bucket": {"capacity": 1000, "leak_per_sec": 0.001}}


def config(servers: list[Server], cluster: bool, algorithm: str, home: Path,
           slow: bool = False) -> Path:
    policy = dict(ALGORITHMS[algorithm], on_error="error", **(SLOW.get(algorithm, {}) if slow else {}))
    urls = [f"redis://127.0.0.1:{s.port}" for s in servers]
    c: dict[str, Any] = {"timeout_ms": 5000, "policies": {"p": policy}}
    if cluster:
        c["cluster"] = {"nodes": urls}
    else:
        c["shards"] = [{"name": f"s{i}", "url": u} for i, u in enumerate(urls)]
    path = home / f"{'cluster' if cluster else 'shards'}-{len(servers)}-{algorithm}.json"
    path.write_text(json.dumps(c))
    return path


def run_cli(argv: list[str]) -> dict[str, Any]:
    """Runs the CLI, returns its JSON (its CPU is read from RUSAGE_CHILDREN around it)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def children_cpu_us() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) * 1e6


def memory_per_key(s: Server, algorithm: str, sample: int = 200) -> dict[str, Any]:
    """MEMORY USAGE (SAMPLES 0: every element) of up to `sample` state keys on one server."""
    keys: list[str] = []
    cursor = "0"
    while len(keys) < sample:
        out = cli(s.port, "SCAN", cursor, "MATCH", "sl:s:p:*", "COUNT", "1000").split("\n")
        cursor = out[0].strip()
        # (not the CLI's own warm-up check's key)
        keys += [k for k in out[1:] if k.strip() and "{bench:warmup}" not in k]
        if cursor == "0":
            break
    keys = keys[:sample]
    if not keys:
        return {}

    def each(cmd: str) -> list[int]:
        out = subprocess.run(["redis-cli", "-p", str(s.port)], input="".join(
            f"{cmd} {k}{' SAMPLES 0' if cmd == 'MEMORY USAGE' else ''}\n" for k in keys),
            check=True, stdout=subprocess.PIPE, text=True).stdout.split()
        if len(out) != len(keys):
            raise SystemExit(f"{cmd}: {len(out)} answers for {len(keys)} keys (one expired?)")
        return [int(x) for x in out]

    sizes = each("MEMORY USAGE")
    members = statistics.mean(each("ZCARD")) if algorithm in ("sliding_log", "concurrency") else None
    return {"bytes": statistics.mean(sizes), "key_len": statistics.mean(len(k) for k in keys),
            "members": members, "sample": len(keys), "example": keys[0]}


def used_memory(s: Server) -> int:
    return int(re.search(r"^used_memory:(\d+)", cli(s.port, "INFO", "memory"), re.M).group(1))


# (keys, checks per key) of the memory phase: the counters hold one value whatever the
# traffic; a sliding log keeps a member per admitted check and a concurrency key one per
# held lease (listpack up to 128 members, Redis's default zset-max-listpack-entries, then a
# skiplist)
MEMORY_SHAPES = {"fixed_window": [(2000, 1)], "sliding_window": [(2000, 1)],
                 "token_bucket": [(2000, 1)], "leaky_bucket": [(2000, 1)],
                 "sliding_log": [(2000, 1), (500, 10), (200, 100), (20, 1000)],
                 "concurrency": [(2000, 1), (500, 10), (200, 100), (20, 1000)]}


def memory_phase(cli_bin: str, pin_client: list[str], algos: list[str], home: Path,
                 pin_redis: list[str]) -> list[dict[str, Any]]:
    """Bytes per key of each algorithm's state on a fresh server: MEMORY USAGE (SAMPLES 0)
    of every state key, and the growth of used_memory per key (with the key space's own
    tables and the expiry entry, which MEMORY USAGE leaves out)."""
    s = start_set(1, False, home, pin_redis)[0]
    out = []
    try:
        for algo in algos:
            cfg = config([s], False, algo, home, slow=True)
            # (the scripts loaded before the figures: the script cache is not a key's)
            run_cli([cli_bin, "bench", "--config", str(cfg), "--policy", "p", "--json",
                     "--requests", "10", "--keys", "1"])
            for keys, per in MEMORY_SHAPES[algo]:
                cli(s.port, "FLUSHALL")
                before = used_memory(s)
                d = run_cli([*pin_client, cli_bin, "bench", "--config", str(cfg), "--policy", "p",
                             "--json", "--concurrency", "16", "--requests", str(keys * per),
                             "--keys", str(keys)])
                if d["allowed"] != keys * per:
                    raise SystemExit(f"memory phase {algo}: {d}")
                grown = used_memory(s) - before
                m = memory_per_key(s, algo, sample=keys)
                if not m:
                    raise SystemExit(f"memory phase {algo}: no state key left to measure")
                # (the keys the run made, less the CLI's own warm-up check's)
                n = int(cli(s.port, "DBSIZE")) - len(cli(s.port, "KEYS", "*{bench:warmup}*").split())
                out.append({"algorithm": algo, "keys": keys, "checks_per_key": per,
                            "redis_keys": n, "used_memory_per_key": grown / max(n, 1), **m})
                print(f"memory {algo:14} {keys} keys x {per} checks: {m['bytes']:.0f} B per key "
                      f"(MEMORY USAGE), used_memory +{grown / max(n, 1):.0f} B per key, "
                      f"{m['members']} members per key", flush=True)
        # a block-list entry (`shardlimit block KEY`), every policy's: what a blocked key costs
        cfg = config([s], False, "fixed_window", home)
        cli(s.port, "FLUSHALL")
        subprocess.run([cli_bin, "block", "--config", str(cfg), "--ttl", "15m", "user:12345"],
                       check=True, stdout=subprocess.DEVNULL)
        keys = [k for k in cli(s.port, "KEYS", "*").split("\n") if k.strip()]
        for k in keys:
            b = int(cli(s.port, "MEMORY", "USAGE", k, "SAMPLES", "0"))
            out.append({"algorithm": "block list entry", "example": k, "bytes": b,
                        "key_len": len(k), "members": None, "keys": 1, "checks_per_key": 0,
                        "used_memory_per_key": None})
    finally:
        s.stop()
    return out


def unbatched_phase(cli_bin: str, pin_client: list[str], algos: list[str], home: Path,
                    pin_redis: list[str], a: argparse.Namespace) -> list[dict[str, Any]]:
    """One decision per script call, as a shard of a large fleet sees it (each of many
    processes sends a shard a few checks a second: they rarely share a call): one shard,
    `--unbatched-processes` CLI processes with one caller each, at once."""
    s = start_set(1, False, home, pin_redis)[0]
    procs_n = a.unbatched_processes
    per = max(1, a.per_shard // procs_n)
    out = []
    try:
        for algo in algos:
            cfg = config([s], False, algo, home)
            argv = [*pin_client, cli_bin, "bench", "--config", str(cfg), "--policy", "p", "--json",
                    "--concurrency", "1", "--keys", str(a.keys_per_shard)]
            run_cli(argv + ["--requests", "100"])
            cli(s.port, "FLUSHALL")
            cli(s.port, "CONFIG", "RESETSTAT")
            cpu0 = s.cpu_us()
            procs = [subprocess.Popen(argv + ["--requests", str(per)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for _ in range(procs_n)]
            ds = []
            for p in procs:
                o, e = p.communicate()
                if p.returncode != 0:
                    raise SystemExit(f"unbatched {algo}: {e.decode()[-2000:]}")
                ds.append(json.loads(o.decode().strip().splitlines()[-1]))
            n = per * procs_n
            cpu = s.cpu_us() - cpu0
            calls, usec, allcalls = s.script_stats()
            not_redis = sum(d.get("fallbacks", 0) + d.get("errors", 0) for d in ds) + \
                n - sum(d["allowed"] for d in ds)
            if not_redis:
                raise SystemExit(f"unbatched {algo}: {not_redis} of {n} decisions did not come "
                                 "from Redis (fallbacks, errors or denials): the run fails")
            r = {"algorithm": algo, "decisions": n, "processes": procs_n,
                 "decisions_per_sec": sum(d["decisions_per_sec"] for d in ds),
                 "redis_cpu_us": cpu / n, "command_us": usec / n, "calls": calls / n,
                 "commands": allcalls / n, "not_from_redis": not_redis}
            out.append(r)
            print(f"unbatched {algo:14} {procs_n} processes x 1 caller: {r['decisions_per_sec']:,.0f}/s, "
                  f"Redis CPU {r['redis_cpu_us']:.2f} µs/dec, commands {r['command_us']:.2f} µs/dec, "
                  f"{r['calls']:.3f} calls/dec, not from Redis: {not_redis}", flush=True)
    finally:
        s.stop()
    return out


def connection_memory(home: Path, pin_redis: list[str], n: int = 500) -> dict[str, Any]:
    """used_memory growth per idle client connection that has sent one command (the client
    structure and its buffers), and what 1,000 of them cost."""
    s = start_set(1, False, home, pin_redis)[0]
    socks = []
    try:
        before = used_memory(s)
        for _ in range(n):
            c = socket.create_connection(("127.0.0.1", s.port))
            c.sendall(b"*1\r\n$4\r\nPING\r\n")
            socks.append(c)
        for c in socks:
            c.recv(16)
        clients = int(re.search(r"^connected_clients:(\d+)", cli(s.port, "INFO", "clients"), re.M).group(1))
        grown = used_memory(s) - before
        # Redis shrinks an idle client's query buffer in its client cron (after 2 s idle)
        time.sleep(4)
        idle = used_memory(s) - before
        r = {"connections": n, "connected_clients": clients, "bytes_per_connection": grown / n,
             "bytes_per_idle_connection": idle / n}
        print(f"connections: {n} clients: used_memory +{grown / n:.0f} B each just after a "
              f"command, +{idle / n:.0f} B after 4 s idle", flush=True)
        return r
    finally:
        for c in socks:
            c.close()
        s.stop()


def one_run(cli_bin: str, pin_client: list[str], servers: list[Server], cluster: bool,
            algorithm: str, home: Path, a: argparse.Namespace) -> dict[str, Any]:
    n = len(servers)
    requests = a.per_shard * n
    conc = a.concurrency or a.per_shard_concurrency * n
    keys = a.keys_per_shard * n
    cfg = config(servers, cluster, algorithm, home)
    for s in servers:
        cli(s.port, "FLUSHALL")
    base = [*pin_client, cli_bin, "bench", "--config", str(cfg), "--policy", "p", "--json"]
    # warm-up (connections, scripts loaded on every server), then count from zero
    run_cli(base + ["--concurrency", str(conc), "--requests", str(200 * n), "--keys", str(keys)])
    for s in servers:
        cli(s.port, "FLUSHALL")
        cli(s.port, "CONFIG", "RESETSTAT")
    cpu0 = [s.cpu_us() for s in servers]
    c0 = children_cpu_us()
    t0 = time.monotonic()
    d = run_cli(base + ["--concurrency", str(conc), "--requests", str(requests), "--keys", str(keys)])
    wall = time.monotonic() - t0
    client_cpu = children_cpu_us() - c0
    cpu = [s.cpu_us() - c for s, c in zip(servers, cpu0)]
    stats = [s.script_stats() for s in servers]
    not_redis = d.get("fallbacks", 0) + d.get("errors", 0) + (requests - d["allowed"] - d["denied"])
    usec = [u for _, u, _ in stats]
    mean_usec = statistics.mean(usec) if usec else 0
    r = {
        "mode": "cluster" if cluster else "shards", "shards": n, "algorithm": algorithm,
        "decisions": requests, "concurrency": conc, "keys": keys,
        "decisions_per_sec": d["decisions_per_sec"], "p50_us": d["p50_us"], "p99_us": d["p99_us"],
        "allowed": d["allowed"], "denied": d["denied"], "not_from_redis": not_redis,
        "redis_cpu_us": sum(cpu) / requests,
        "command_us": sum(usec) / requests,
        "calls": sum(c for c, _, _ in stats) / requests,
        "commands": sum(c for _, _, c in stats) / requests,
        "busiest": (max(usec) / mean_usec) if mean_usec else None,
        "client_cpu_us": client_cpu / requests,
        # what the Redis processes used of the wall time: the share of a core each is busy
        "redis_busy": sum(cpu) / (wall * 1e6),
        "client_wall_s": wall,
    }
    if d["denied"]:
        raise SystemExit(f"{r['mode']} {n} {algorithm}: {d['denied']} denials with limits far "
                         "above the traffic (every decision should be an admission)")
    if not_redis:
        raise SystemExit(f"{r['mode']} {n} {algorithm}: {not_redis} of {requests} decisions "
                         f"did not come from Redis (fallbacks or errors): the run fails ({d})")
    return r


def med(rs: list[dict[str, Any]], field: str) -> Optional[float]:
    v = [r[field] for r in rs if r.get(field) is not None]
    return statistics.median(v) if v else None


def f(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"


def report(rows: list[dict[str, Any]], memory: list[dict[str, Any]],
           unbatched: list[dict[str, Any]], conn: dict[str, Any], a: argparse.Namespace,
           meta: dict[str, str]) -> list[str]:
    out: list[str] = []
    w = out.append
    w("## Scale out: 1 to 8 shards, client-side and Redis Cluster (`make bench-scale`)")
    w("")
    conc = (f"{a.concurrency} concurrent callers at every size" if a.concurrency
            else f"{a.per_shard_concurrency} concurrent callers per shard")
    w(f"Written by `{meta['command']}` on {meta['date']} (commit {meta['commit']}, Redis "
      f"{meta['redis']}, {meta['cpu']}; load average before `{meta['load_before']}`, after "
      f"`{meta['load_after']}`), {a.rounds} round(s), medians. The work grows with the "
      f"shards: n shards get {a.per_shard:,} decisions per shard ({a.per_shard * 8:,} at 8) "
      f"from one `shardlimit bench` process ({conc}, {meta.get('build', 'release build')}) over "
      f"{a.keys_per_shard:,} keys per shard, so each shard sees the same load at every "
      "size. `shards`: n standalone redis-servers, routed by the client (jump hash); "
      "`cluster`: a Redis Cluster of n primaries (slots split evenly, no replicas), "
      "routed by slot. Every policy is `on_error: error` with limits far above the "
      "traffic: every decision must be a Redis admission, and a run with any decision "
      f"not from Redis fails (this run: {sum(r['not_from_redis'] for r in rows)} in "
      f"{len(rows)} runs).")
    w("")
    w(f"- {meta['pinning']}")
    w("- **Redis CPU µs/decision** (utime+stime of every redis-server of the run, from "
      "`/proc/<pid>/stat`, ÷ decisions) is the figure that sizes a fleet: commands, "
      "network I/O, the cluster bus and timers. **command µs/decision**: `INFO "
      "commandstats` usec of the decisions' commands summed over the servers. **calls**: "
      "script calls per decision (below 1: concurrent checks of one shard share a batch "
      "call). **busiest**: the busiest server's command time ÷ the mean (1.00: even).")
    w("- **What decisions/s means here, and what it does not**: every redis-server and the "
      "client share 2 cores with other work, so the total is bounded by the cores, not by "
      "the shards: 8 Redis processes on one core cannot go 8× faster than one. It shows "
      "that adding shards costs the client nothing it cannot afford; it is not the "
      "throughput of 8 real servers. That throughput is 8 × (a core's µs ÷ Redis CPU "
      "µs/decision): see [capacity.md](capacity.md).")
    w("")
    algos = [x for x in ALGORITHMS if any(r["algorithm"] == x for r in rows)]
    sizes = sorted({r["shards"] for r in rows})
    for algo in algos:
        w(f"### {algo}")
        w("")
        w("| mode | shards | decisions | decisions/s | p50 µs | p99 µs | client CPU µs/decision "
          "| Redis CPU µs/decision | command µs/decision | calls/decision | Redis commands/decision "
          "| busiest | Redis CPU ÷ 1 shard |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for mode in ("shards", "cluster"):
            base = None
            for n in sizes:
                rs = [r for r in rows if (r["mode"], r["shards"], r["algorithm"]) == (mode, n, algo)]
                if not rs:
                    continue
                cpu = med(rs, "redis_cpu_us")
                base = cpu if base is None else base
                rate = [r["decisions_per_sec"] for r in rs]
                w(f"| {mode} | {n} | {rs[0]['decisions']:,} | {f(med(rs, 'decisions_per_sec'))}"
                  + (f" ({min(rate):,.0f}–{max(rate):,.0f})" if len(rs) > 1 else "")
                  + f" | {f(med(rs, 'p50_us'))} | {f(med(rs, 'p99_us'))} | {f(med(rs, 'client_cpu_us'), 2)} "
                  f"| {f(cpu, 2)} | {f(med(rs, 'command_us'), 2)} | {f(med(rs, 'calls'), 3)} "
                  f"| {f(med(rs, 'commands'), 2)} | {f(med(rs, 'busiest'), 2)} "
                  f"| {f(cpu / base if cpu and base else None, 2)}× |")
        w("")
    if unbatched:
        w(f"### One decision per script call ({a.unbatched_processes} processes, one caller each, one shard)")
        w("")
        w("What a shard of a large fleet sees: many processes each send it a few checks a "
          "second, so their checks rarely share a script call. One redis-server, "
          f"{a.unbatched_processes} `shardlimit bench --concurrency 1` processes at once "
          "(one connection each).")
        w("")
        w("| algorithm | decisions | decisions/s (sum) | Redis CPU µs/decision | command µs/decision | calls/decision | Redis commands/decision |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in unbatched:
            w(f"| {r['algorithm']} | {r['decisions']:,} | {f(r['decisions_per_sec'])} | "
              f"{f(r['redis_cpu_us'], 2)} | {f(r['command_us'], 2)} | {f(r['calls'], 3)} | "
              f"{f(r['commands'], 2)} |")
        w("")
    if memory:
        w("### Memory per key")
        w("")
        w("One fresh redis-server; `shardlimit bench` makes the keys (prefix `sl:`, user keys "
          "`bench:<n>`, 10 bytes or so), then `MEMORY USAGE <key> SAMPLES 0` of every state key "
          "(mean), and the growth of `used_memory` per key (which adds the key space's tables "
          "and the expiry entry that `MEMORY USAGE` leaves out). A counter holds one value "
          "whatever the traffic; a sliding log holds one member per admitted check in its "
          "window, a concurrency key one per held lease (a listpack up to 128 members, "
          "Redis's `zset-max-listpack-entries`, then a skiplist).")
        w("")
        w("| state | keys | checks per key | members per key | MEMORY USAGE bytes/key | used_memory growth bytes/key | key name |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for m in memory:
            w(f"| {m['algorithm']} | {m['keys']:,} | {m['checks_per_key']:,} | "
              + (f(m['members'], 0) if m.get('members') is not None else "")
              + f" | {f(m['bytes'], 0)} | {f(m.get('used_memory_per_key'), 0)} | `{m['example']}` |")
        w("")
    if conn:
        w(f"Connections: {conn['connections']} client connections that each sent one command grew "
          f"`used_memory` by {f(conn['bytes_per_connection'], 0)} B each just after it "
          f"({f(conn['bytes_per_connection'] * 1000 / 1e6, 1)} MB per 1,000 connections), and by "
          f"{f(conn['bytes_per_idle_connection'], 0)} B each after 4 s idle (Redis shrinks idle "
          "clients' query buffers in its client cron).")
        w("")
    return out


def write_section(path: Path, section: list[str]) -> None:
    """Replaces (or appends) this section of `path`, from its heading to the next `## `."""
    head = section[0].split("(")[0].strip()
    lines = path.read_text().splitlines() if path.exists() else []
    out: list[str] = []
    i, done = 0, False
    while i < len(lines):
        if lines[i].startswith("## ") and lines[i].startswith(head):
            i += 1
            while i < len(lines) and not lines[i].startswith("## "):
                i += 1
            out += section
            done = True
            continue
        out.append(lines[i])
        i += 1
    if not done:
        while out and not out[-1].strip():
            out.pop()
        out += [""] + section
    path.write_text("\n".join(out).rstrip("\n") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--modes", default="shards,cluster")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-shard", type=int, default=15000)
    ap.add_argument("--per-shard-concurrency", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=0)
    ap.add_argument("--keys-per-shard", type=int, default=5000)
    ap.add_argument("--no-memory", dest="memory", action="store_false",
                    help="skip the memory phase")
    ap.add_argument("--unbatched-processes", type=int, default=8,
                    help="processes of the one-decision-per-call phase (0: skip it)")
    ap.add_argument("--results", help="append each run's JSON line to this file")
    ap.add_argument("--write", help="put the section into this markdown file")
    ap.add_argument("--meta", action="append", default=[])
    a = ap.parse_args()
    meta = dict(m.split("=", 1) for m in a.meta)
    sizes = [int(x) for x in a.sizes.split(",")]
    algos = a.algorithms.split(",")
    for x in algos:
        if x not in ALGORITHMS:
            raise SystemExit(f"unknown algorithm {x!r}; one of {', '.join(ALGORITHMS)}")
    modes = a.modes.split(",")
    two = (os.cpu_count() or 1) >= 2 and shutil.which("taskset")
    pin_redis = ["taskset", "-c", "1"] if two else []
    pin_client = ["taskset", "-c", "0"] if two else []
    meta.setdefault("pinning", "every redis-server pinned to CPU 1, the client to CPU 0 (`taskset`): "
                    "the Redis processes of a run share one core" if two else "no pinning (one CPU)")
    meta.setdefault("load_before", open("/proc/loadavg").read().strip())
    home = Path(tempfile.mkdtemp(prefix="shardlimit-scale-"))
    rows: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    unbatched: list[dict[str, Any]] = []
    conn: dict[str, Any] = {}
    servers: list[Server] = []
    try:
        if a.memory:
            memory = memory_phase(a.cli, pin_client, algos, home, pin_redis)
            conn = connection_memory(home, pin_redis)
        if a.unbatched_processes:
            unbatched = unbatched_phase(a.cli, pin_client, algos, home, pin_redis, a)
        for rnd in range(1, a.rounds + 1):
            # alternate which mode goes first
            for mode in (modes if rnd % 2 else modes[::-1]):
                for n in sizes:
                    servers = start_set(n, mode == "cluster", home, pin_redis)
                    try:
                        for algo in algos:
                            r = one_run(a.cli, pin_client, servers, mode == "cluster", algo, home, a)
                            r["round"] = rnd
                            rows.append(r)
                            if a.results:
                                with open(a.results, "a") as fh:
                                    fh.write(json.dumps(r) + "\n")
                            print(f"round {rnd} {mode:7} {n} {algo:14} {r['decisions_per_sec']:>9,.0f}/s "
                                  f"Redis CPU {r['redis_cpu_us']:6.2f} µs/dec, commands {r['command_us']:6.2f} "
                                  f"µs/dec, {r['calls']:.3f} calls/dec, busiest {r['busiest'] or 0:.2f}, "
                                  f"client {r['client_cpu_us']:5.2f} µs/dec, not from Redis: "
                                  f"{r['not_from_redis']}", flush=True)
                    finally:
                        for s in servers:
                            s.stop()
                        servers = []
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(home, ignore_errors=True)
    meta.setdefault("load_after", open("/proc/loadavg").read().strip())
    print(f"decisions not from Redis: {sum(r['not_from_redis'] for r in rows)} in {len(rows)} runs")
    if a.results:
        with open(a.results, "a") as fh:
            for r in unbatched:
                fh.write(json.dumps(dict(r, mode="unbatched")) + "\n")
            for m in memory:
                fh.write(json.dumps(dict(m, mode="memory")) + "\n")
            if conn:
                fh.write(json.dumps(dict(conn, mode="connections")) + "\n")
    section = report(rows, memory, unbatched, conn, a, meta)
    print()
    print("\n".join(section))
    if a.write:
        write_section(Path(a.write), section)
        print(f"== wrote the section into {a.write}")


if __name__ == "__main__":
    sys.exit(main())
