"""Writes tests/vectors/routing.json with an implementation of the routing contract that is
independent of the Rust one (the `xxhash` package from PyPI and a direct transcription of
Lamping & Veach's jump consistent hash). Run: python3 tests/tools/gen_routing_vectors.py"""
import json
import os
import xxhash


def routing_key(key: str) -> bytes:
    b = key.encode("utf-8")
    start = b.find(b"{")
    if start >= 0:
        end = b.find(b"}", start + 1)
        if end > start + 1:
            return b[start + 1 : end]
    return b


def jump(key: int, buckets: int) -> int:
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


KEYS = ["", "a", "user:12345", "user:12346", "ip:203.0.113.7", "tenant:acme", "{tenant:acme}:user:1",
        "{tenant:acme}:user:2", "a{}b{c}", "a{b", "a}b{c}", "{}", "{x}", "héllo:wörld", "api-key:sk_live_abc",
        "global"] + [f"key:{i}" for i in range(48)]

cases = []
for k in KEYS:
    h = xxhash.xxh64(routing_key(k), seed=0).intdigest()
    cases.append({"key": k, "routing_key": routing_key(k).decode("utf-8"), "xxh64": f"{h:016x}",
                  "shard_for": [jump(h, n) for n in range(1, 17)]})
doc = {"description": "Routing contract: shard = jump_consistent_hash(xxh64(routing_key, seed 0), n). "
       "shard_for[n-1] is the shard index among n shards, for n = 1..16.", "cases": cases}
out = os.path.join(os.path.dirname(__file__), "..", "vectors", "routing.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump(doc, f, indent=1, ensure_ascii=False)
    f.write("\n")
