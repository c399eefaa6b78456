"""The Python worker of `make demo` (see examples/demo/README.md).

Sends a fixed number of checks over a shared set of (policy, key) pairs and prints one JSON
line with what was admitted; the Rust, Node and Go workers do exactly the same.

    python examples/demo/worker.py --config CONFIG.json [--requests 2400] [--concurrency 16]
        [--keys 8] [--policies billing,demo_daily,demo_burst] [--instance 1] [--barrier]

Check j goes to pair (j + 7 * instance) % len(pairs), pairs being every policy x keys
user:0..keys. --barrier waits for standard input to close before sending (the demo starts
every worker, then releases them together). Progress goes to stderr as `progress DONE/TOTAL`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import shardlimit


async def run(args: argparse.Namespace, limiter: shardlimit.Limiter) -> dict:
    pairs = [(p, f"user:{k}") for p in args.policies.split(",") for k in range(args.keys)]
    per_key = {f"{p}/{k}": 0 for p, k in pairs}
    tally = {"allowed": 0, "denied": 0, "fallback": 0, "errors": 0}
    next_j = 0
    done = 0
    step = max(1, args.requests // 20)

    async def one_caller() -> None:
        nonlocal next_j, done
        while next_j < args.requests:
            j = next_j
            next_j += 1
            policy, key = pairs[(j + 7 * args.instance) % len(pairs)]
            try:
                d = await limiter.acheck(key, policy)
            except shardlimit.Error as e:
                if tally["errors"] == 0:
                    print(f"python worker: {e}", file=sys.stderr)
                tally["errors"] += 1
            else:
                if d.source in ("fallback", "local_fallback"):
                    tally["fallback"] += 1
                elif d.allowed:
                    tally["allowed"] += 1
                    per_key[f"{policy}/{key}"] += 1
                else:
                    tally["denied"] += 1
            done += 1
            if done % step == 0:
                print(f"progress {done}/{args.requests}", file=sys.stderr, flush=True)

    started = time.monotonic()
    await asyncio.gather(*(one_caller() for _ in range(args.concurrency)))
    return {
        "language": "python",
        "instance": args.instance,
        "engine": "redis" if "shards" in json.load(open(args.config)) else "memory",
        "sent": args.requests,
        **tally,
        "elapsed_ms": int((time.monotonic() - started) * 1000),
        "per_key": per_key,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--policies", default="billing,demo_daily,demo_burst")
    ap.add_argument("--instance", type=int, default=1)
    ap.add_argument("--barrier", action="store_true")
    args = ap.parse_args()
    limiter = shardlimit.Limiter.from_config_file(args.config)
    for p in args.policies.split(","):
        limiter.peek("demo:unused", p)  # unknown policy -> error now; opens the connections
    print("ready", file=sys.stderr, flush=True)
    if args.barrier:
        sys.stdin.read()
    print(json.dumps(asyncio.run(run(args, limiter))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
