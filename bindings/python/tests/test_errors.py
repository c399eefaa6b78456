"""The exception table against the core's ErrorKind list, and bad input of every sort
raising the right exception with the core's message."""

from __future__ import annotations

import asyncio
import builtins
import json
from pathlib import Path
from typing import Callable

import pytest
from redis_support import RedisServer, config, free_port

import shardlimit
from shardlimit import _errors, _shardlimit
from shardlimit import Limit, Limiter


def test_every_core_error_kind_has_its_own_class() -> None:
    kinds = dict(_shardlimit.ERROR_KINDS)
    assert len(kinds) >= 9
    assert set(_errors.ERRORS_BY_KIND) == set(kinds.values())
    classes = list(_errors.ERRORS_BY_KIND.values())
    assert len(set(classes)) == len(classes), "one class per kind"
    for code, name in kinds.items():
        cls = _errors.ERRORS_BY_KIND[name]
        assert (cls.kind, cls.code) == (name, code)
        assert issubclass(cls, shardlimit.Error)
        assert getattr(shardlimit, cls.__name__) is cls, "exported by the package"
        assert issubclass(cls, shardlimit.BackendError) == (name in _shardlimit.BACKEND_ERROR_KINDS)
        err = _errors._from_core(name, code, "message")
        assert type(err) is cls and str(err) == "message"


SPEC = json.loads((Path(__file__).resolve().parents[3] / "spec" / "errors.json").read_text())


def test_hierarchy_follows_spec_errors_json() -> None:
    kinds = {k["name"]: k for k in SPEC["kinds"]}
    assert set(_errors.ERRORS_BY_KIND) == set(kinds), "one class per kind of the spec"
    for name, k in kinds.items():
        cls = _errors.ERRORS_BY_KIND[name]
        assert cls.code == k["code"]
        assert issubclass(cls, shardlimit.BackendError) == k["backend"], name
        # the shardlimit classes above it are exactly the spec's parent chain
        chain, parent = [], k["parent"]
        while parent is not None:
            chain.append(_errors.ERRORS_BY_KIND[parent])
            parent = kinds[parent]["parent"]
        above = [c for c in cls.__mro__[1:] if c in _errors.ERRORS_BY_KIND.values()]
        assert above == chain, name
    assert issubclass(shardlimit.UnknownPolicyError, shardlimit.InvalidArgumentError)
    # code 6 (routing) is retired: no class, no export
    for retired in SPEC["retired"]:
        assert retired["code"] not in {cls.code for cls in _errors.ERRORS_BY_KIND.values()}
        camel = "".join(w.title() for w in retired["name"].split("_")) + "Error"
        assert not hasattr(shardlimit, camel), camel


def test_no_error_is_an_oserror() -> None:
    """gunicorn takes an OSError escaping a request for a dead client socket and sends no
    response at all: no shardlimit error may be one."""
    for cls in _errors.ERRORS_BY_KIND.values():
        assert not issubclass(cls, OSError), cls
    assert not issubclass(shardlimit.RateLimitExceeded, OSError)
    assert issubclass(shardlimit.InvalidArgumentError, ValueError)
    assert issubclass(shardlimit.ConfigError, ValueError)
    assert not issubclass(shardlimit.RateLimitExceeded, shardlimit.Error)


def test_limit_arguments_are_invalid_arguments() -> None:
    makes: list[Callable[[], Limit]] = [lambda: Limit.fixed_window(-5, 60), lambda: Limit.fixed_window(0, 60),
                 lambda: Limit.sliding_log(2**70, 60), lambda: Limit.token_bucket(-1, 1.0),
                 lambda: Limit.concurrency(-2, 30), lambda: Limit.fixed_window(5, -1),
                 lambda: Limit.fixed_window(5, float("nan"))]
    for make in makes:
        with pytest.raises(shardlimit.InvalidArgumentError):
            make()
    with pytest.raises(shardlimit.InvalidArgumentError, match="limit"):
        Limit.fixed_window(-5, 60)
    with pytest.raises(TypeError):
        Limit.fixed_window("5", 60)  # type: ignore[arg-type]


def test_an_unknown_kind_still_raises_an_error() -> None:
    err = _errors._from_core("brand_new", 99, "m")
    assert isinstance(err, shardlimit.Error) and (err.kind, err.code) == ("brand_new", 99)


LIMITER = Limiter.from_json(
    '{"policies": {"api": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 1},'
    ' "pool": {"algorithm": "concurrency", "max": 5, "lease_ttl": "1m"}}}'
)


@pytest.mark.parametrize(
    "call",
    [
        lambda: LIMITER.check(42, "api"),  # type: ignore[arg-type]
        lambda: LIMITER.check(b"k", "api"),  # type: ignore[arg-type]
        lambda: LIMITER.check("k", 3),  # type: ignore[arg-type]
        lambda: LIMITER.check("k", None),  # type: ignore[arg-type]
        lambda: LIMITER.check("k", "api", "1"),  # type: ignore[arg-type]
        lambda: LIMITER.check("k", "api", 1.0),  # type: ignore[arg-type]
        lambda: LIMITER.check("k", "api", True),
        lambda: LIMITER.acquire("k", "pool", 2.5),  # type: ignore[arg-type]
        lambda: LIMITER.release("lease"),  # type: ignore[arg-type]
        lambda: Limit.fixed_window("5", 1.0),  # type: ignore[arg-type]
        lambda: Limiter.from_json(5),  # type: ignore[arg-type]
    ],
)
def test_wrong_types_raise_type_error(call: object) -> None:
    with pytest.raises(TypeError):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("cost", [-1, 0, -(2**70), 2**64])
def test_bad_costs_are_invalid_arguments(cost: int) -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="cost"):
        LIMITER.check("k", "api", cost)
    with pytest.raises(shardlimit.InvalidArgumentError, match="cost"):
        LIMITER.acquire("k", "pool", cost)


def test_bad_keys_are_invalid_arguments() -> None:
    with pytest.raises(shardlimit.InvalidArgumentError, match="key.*must not be empty") as e:
        LIMITER.check("", "api")
    assert (e.value.kind, e.value.code) == ("invalid_argument", 2)
    with pytest.raises(shardlimit.InvalidArgumentError, match="key.*1025 bytes"):
        LIMITER.check("x" * 1025, "api")


def test_unknown_policy() -> None:
    with pytest.raises(shardlimit.UnknownPolicyError, match="unknown policy `nope`") as e:
        LIMITER.check("k", "nope")
    assert e.value.kind == "unknown_policy"
    with pytest.raises(shardlimit.UnknownPolicyError):
        LIMITER.policy("nope")


def test_async_calls_raise_the_same_errors() -> None:
    async def main() -> None:
        with pytest.raises(shardlimit.UnknownPolicyError):
            await LIMITER.acheck("k", "nope")
        with pytest.raises(shardlimit.InvalidArgumentError):
            await LIMITER.acheck("", "api")

    asyncio.run(main())


def test_async_calls_are_coroutines() -> None:
    # made outside a loop, run by asyncio.run: the future is made on the loop that awaits
    d = asyncio.run(LIMITER.acheck("coroutine", "api"))
    assert d.allowed and d.remaining == 4
    assert asyncio.iscoroutine(coro := LIMITER.apeek("coroutine", "api"))
    assert asyncio.run(coro).remaining == 4
    # bad arguments still fail at the call, not at the await
    with pytest.raises(shardlimit.UnknownPolicyError):
        LIMITER.acheck("k", "nope")  # type: ignore[unused-coroutine]


@pytest.mark.parametrize(
    "text, field",
    [
        ("{not json", "config: not valid JSON"),
        ('{"policies": {"a": {"algorithm": "fixed_window", "limit": 5, "window": "abc"}}}',
         "policies.a.window"),
        ('{"policies": {"a": {"algorithm": "fixed_window", "limit": -5, "window": "1s"}}}',
         "policies.a.limit"),
        ('{"policies": {"a": {"algorithm": "magic"}}}', "policies.a.algorithm"),
        ('{"shards": []}', "shards: is empty"),
        ('{"shards": [{"name": "a", "url": "http://x"}]}', "shards[0].url"),
        ('{"shardz": []}', "shardz: unknown field"),
    ],
)
def test_bad_config_is_a_config_error(text: str, field: str) -> None:
    with pytest.raises(shardlimit.ConfigError) as e:
        Limiter.from_json(text)
    assert str(e.value).startswith(field), str(e.value)
    assert e.value.kind == "config"


def test_config_files(tmp_path: Path) -> None:
    with pytest.raises(shardlimit.ConfigFileError, match="cannot read config") as e:
        Limiter.from_config_file(tmp_path / "missing.json")
    assert e.value.kind == "io" and not isinstance(e.value, OSError)
    bad = tmp_path / "bad.json"
    bad.write_text('{"policies": {"a": {"algorithm": "fixed_window", "limit": 0, "window": 1}}}')
    with pytest.raises(shardlimit.ConfigError, match="bad.json: policies.a.limit"):
        Limiter.from_config_file(bad)
    good = tmp_path / "good.json"
    good.write_text('{"policies": {"a": {"algorithm": "fixed_window", "limit": 1, "window": 1}}}')
    assert Limiter.from_config_file(str(good)).policies == ["a"]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Limit.fixed_window(0, 1.0), "invalid argument `limit.limit`: must be between 1"),
        (lambda: Limit.fixed_window(-5, 1.0), "invalid argument `limit.limit`: must be between 1"),
        (lambda: Limit.fixed_window(5, 0.0), "invalid argument `limit.window`: must be between 1ms"),
        (lambda: Limit.fixed_window(5, -1.0), "invalid argument `limit.window`: expected a finite"),
        (lambda: Limit.sliding_log(5, float("nan")),
         "invalid argument `limit.window`: expected a finite"),
        (lambda: Limit.token_bucket(10, -1.0), "invalid argument `limit.refill_per_sec`"),
        (lambda: Limit.concurrency(3, 0.0001), "invalid argument `limit.lease_ttl`"),
    ],
)
def test_bad_limits_are_invalid_arguments(make: object, message: str) -> None:
    with pytest.raises(shardlimit.InvalidArgumentError) as e:
        make()  # type: ignore[operator]
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: shardlimit.Policy("bad name", Limit.fixed_window(1, 1.0)), "policies.bad name"),
        (lambda: shardlimit.Policy("p", Limit.fixed_window(1, 1.0), "maybe"),
         "policies.p.on_error"),
    ],
)
def test_bad_policies_are_config_errors(make: object, message: str) -> None:
    with pytest.raises(shardlimit.ConfigError) as e:
        make()  # type: ignore[operator]
    assert str(e.value).startswith(message), str(e.value)


POLICIES = {"api": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}


@pytest.mark.parametrize("engine", ["memory", "redis"])
def test_acquire_of_a_policy_that_is_not_a_concurrency_limit_is_invalid(
    redis: RedisServer, engine: str
) -> None:
    # it would take a unit with a lease no release could give back: refused, taking nothing
    limiter = Limiter.from_json(json.dumps({"policies": POLICIES})) if engine == "memory" \
        else Limiter.from_json(config([redis], POLICIES))
    match = "api is not a concurrency policy"
    with pytest.raises(shardlimit.InvalidArgumentError, match=match) as e:
        limiter.acquire("k", "api")
    assert e.value.kind == "invalid_argument"
    with pytest.raises(shardlimit.InvalidArgumentError, match=match):
        with limiter.lease("k", "api"):
            pass

    async def main() -> None:
        with pytest.raises(shardlimit.InvalidArgumentError, match=match):
            await limiter.aacquire("k", "api")
        with pytest.raises(shardlimit.InvalidArgumentError, match=match):
            async with limiter.lease("k", "api"):
                pass

    asyncio.run(main())
    assert limiter.peek("k", "api").remaining == 5


def test_unreachable_redis_is_a_connection_error() -> None:
    # a loopback port nothing listens on: the connection is refused
    limiter = Limiter.from_json(json.dumps({
        "shards": [{"name": "gone", "url": f"redis://127.0.0.1:{free_port()}"}],
        "timeout_ms": 2000,
        "policies": POLICIES,
    }))
    try:
        d = limiter.check("k", "api")
    except shardlimit.BackendError as e:
        assert isinstance(e, shardlimit.ConnectionError), repr(e)
        assert e.kind == "connection" and "shard `gone`" in str(e)
    else:
        # a core that applies the policy's on_error answers instead: "open" allows
        assert (d.source, d.allowed) == ("fallback", True)


def test_a_paused_redis_is_a_timeout(redis: RedisServer) -> None:
    limiter = Limiter.from_json(config([redis], POLICIES, timeout_ms=100))
    assert limiter.check("k", "api").allowed  # connected
    assert redis.command("CLIENT", "PAUSE", 2000, "ALL") == "OK"
    try:
        d = limiter.check("k", "api")
    except shardlimit.BackendError as e:
        assert isinstance(e, shardlimit.TimeoutError), repr(e)
        assert isinstance(e, TimeoutError)
        assert "no answer within 100 ms" in str(e)
    else:
        assert (d.source, d.allowed) == ("fallback", True)
    finally:
        redis.command("CLIENT", "UNPAUSE")
