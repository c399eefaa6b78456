"""Install test of the wheel (scripts/test-dist.sh): python check.py PORT VERSION"""
import sys

import shardlimit

port, version = int(sys.argv[1]), sys.argv[2]
assert shardlimit.__version__ == version, (shardlimit.__version__, version)
assert "site-packages" in shardlimit.__file__, shardlimit.__file__
config = (
    '{"shards":[{"name":"a","url":"redis://127.0.0.1:%d"}],"timeout_ms":2000,'
    '"policies":{"p":{"algorithm":"fixed_window","limit":5,"window":"1h"}}}' % port
)
limiter = shardlimit.Limiter.from_json(config)
decisions = [limiter.check("user:py", "p") for _ in range(8)]
allowed = [d.allowed for d in decisions]
assert allowed == [True] * 5 + [False] * 3, allowed
assert all(d.shard == 0 for d in decisions), [d.source for d in decisions]
print(f"python: shardlimit {shardlimit.__version__} admitted {sum(allowed)} of 8 (limit 5)")
