"""The core's rate-limited warning lines in Python: every fallback reaches
``logging.getLogger("shardlimit")`` (or the sink set with ``set_log_sink``), one line per
policy per ``log_interval`` with the count suppressed since the last."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from redis_support import free_port

from shardlimit import Limiter, ManualClock

T0 = 1_700_000_000_000_000


def dead_config() -> str:
    # nothing listens on the port: every check falls back to on_error
    return json.dumps(
        {
            "timeout_ms": 300,
            "shards": [{"name": "dead", "url": f"redis://127.0.0.1:{free_port()}"}],
            "policies": {"api": {"rate": "10/minute", "on_error": "open"}},
        }
    )


class Lines:
    """Records collected on shardlimit's log thread; wait() blocks (bounded) for n."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.cond = threading.Condition()

    def add(self, item: Any) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def wait(self, pred: Any, n: int) -> list[Any]:
        with self.cond:
            assert self.cond.wait_for(
                lambda: len([i for i in self.items if pred(i)]) >= n, timeout=10
            ), self.items
            return [i for i in self.items if pred(i)]


def is_api_fallback(r: dict[str, Any]) -> bool:
    return bool(r["reason"] == "fallback" and r["subject"] == "api")


def test_a_thousand_fallbacks_are_one_line_then_the_next_carries_the_count() -> None:
    clock = ManualClock(T0)
    limiter = Limiter.from_json(dead_config(), clock=clock)
    lines = Lines()
    limiter.set_log_sink(lines.add)
    for _ in range(1000):
        d = limiter.check("k", "api")
        assert d.allowed and d.source == "fallback"
    (first,) = lines.wait(is_api_fallback, 1)
    assert first["suppressed"] == 0
    assert first["allowed"] is True
    assert first["level"] == "warn" and first["target"] == "shardlimit"
    assert first["error_kind"] in ("connection", "unavailable", "timeout")
    assert "policy `api` fell back to on_error and allowed" in first["message"]
    # the interval later on the limiter's clock: the next line says 999 were not
    # written, so no other fallback line came between the two
    clock.advance_us(10_000_000)
    limiter.check("k", "api")
    got = lines.wait(is_api_fallback, 2)
    assert [r["suppressed"] for r in got] == [0, 999]
    assert "(999 more since the last line" in got[1]["message"]
    circuit = lines.wait(lambda r: r["reason"] == "circuit_opened", 1)
    assert circuit[0]["subject"] == "dead"
    limiter.close()


def test_by_default_the_lines_go_to_the_shardlimit_logger() -> None:
    records = Lines()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.add(record)

    logger = logging.getLogger("shardlimit")
    handler = Handler()
    logger.addHandler(handler)
    try:
        limiter = Limiter.from_json(dead_config())
        for _ in range(1000):
            assert limiter.check("k", "api").allowed
        (rec,) = records.wait(lambda r: r.shardlimit["reason"] == "fallback", 1)
        assert rec.levelno == logging.WARNING
        assert rec.name == "shardlimit"
        assert "fell back to on_error" in rec.getMessage()
        assert rec.shardlimit["subject"] == "api"
        assert rec.shardlimit["suppressed"] == 0
        limiter.set_log_sink(None)
        limiter.close()
    finally:
        logger.removeHandler(handler)


def test_the_interval_comes_from_the_config_and_every_fallback_is_counted() -> None:
    # log_interval 1ms on the limiter's clock: every check is a line or in the
    # suppressed count of the next line
    config = json.loads(dead_config())
    config["log_interval"] = "1ms"
    clock = ManualClock(T0)
    limiter = Limiter.from_json(json.dumps(config), clock=clock)
    lines = Lines()
    limiter.set_log_sink(lines.add)
    for i in range(1, 301):
        limiter.check("k", "api")
        if i % 100 == 0:
            clock.advance_us(2_000)
    clock.advance_us(2_000)
    limiter.check("k", "api")
    got = lines.wait(is_api_fallback, 4)
    assert sum(1 + r["suppressed"] for r in got) == 301, got
    limiter.close()
