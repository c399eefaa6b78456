"""Route decorators as users of Flask-Limiter and slowapi expect them, against a real Redis:
keys that do not depend on how the app was started, one budget per route made by a
factory, overrides on a decorated route, deduct_when per limit, a default relaxed for one
route, Blueprint and WebSocket limits enforced, a decorator without a middleware refused
(at start-up when the app has a middleware that was not given its limits), and argument
errors that name the argument."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import httpx
import pytest
from flask import Blueprint, Flask
from redis_support import RedisServer, config
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket

import shardlimit
import shardlimit.flask
from shardlimit import Limiter
from shardlimit.asgi import RateLimitMiddleware, RouteLimits
from shardlimit.flask import FlaskLimits

POLICIES = {
    "api": {"algorithm": "fixed_window", "limit": 100, "window": "1h", "overrides": True,
            "on_error": "error"},
    "default": {"algorithm": "fixed_window", "limit": 2, "window": "1h", "on_error": "error"},
}


@pytest.fixture
def limiter(redis: RedisServer) -> Limiter:
    return Limiter.from_json(config([redis], POLICIES))


def user(request: Any) -> str:
    return "user:1"


def get(app: Any, path: str) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get(path)

    return asyncio.run(main())


def open_websocket(app: Any, path: str) -> list[dict[str, Any]]:
    """Opens a WebSocket to an ASGI app as a server would: what the app sent."""
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "websocket.connect"})

        async def receive() -> dict[str, Any]:
            return await inbox.get()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "websocket.close":
                await inbox.put({"type": "websocket.disconnect", "code": message.get("code", 1000)})

        scope = {"type": "websocket", "asgi": {"version": "3.0"}, "scheme": "ws", "path": path,
                 "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
                 "client": ("10.1.2.3", 40000), "server": ("t", 80), "subprotocols": []}
        await asyncio.wait_for(app(scope, receive, send), 10)

    asyncio.run(main())
    return sent


def login_app(limiter: Limiter, module: str) -> Flask:
    """The app of a module named ``module``: ``python app.py`` runs it as ``__main__``,
    ``gunicorn app:app`` as ``app``."""
    app = Flask(module)
    limits = FlaskLimits(limiter, app, warm_up=0)
    ns: dict[str, Any] = {"__name__": module}
    exec("def login():\n    return 'ok'\n", ns)
    app.post("/login")(limits.limit("5/minute", key=user)(ns["login"]))
    return app


def test_a_route_key_does_not_depend_on_the_module_name(limiter: Limiter) -> None:
    # two processes of one app, one started as a script, one by a server: one budget
    script = login_app(limiter, "__main__").test_client()
    served = login_app(limiter, "app").test_client()
    codes = [script.post("/login").status_code for _ in range(3)]
    codes += [served.post("/login").status_code for _ in range(3)]
    assert codes == [200] * 5 + [429]


def test_routes_made_by_one_factory_keep_their_own_budgets(limiter: Limiter) -> None:
    app = Flask("factory")
    limits = FlaskLimits(limiter, app, warm_up=0)

    def make(path: str) -> None:
        def handler() -> str:
            return path

        app.get(path, endpoint=path)(limits.limit("1/minute", key=user)(handler))

    make("/a")
    make("/b")
    client = app.test_client()
    assert [client.get("/a").status_code, client.get("/b").status_code] == [200, 200]
    assert client.get("/a").status_code == 429
    # the key names are documented: the qualified name, #2 for the second
    assert limits.route_name(app.view_functions["/a"]) == "test_routes_made_by_one_factory_keep_their_own_budgets.<locals>.make.<locals>.handler"
    assert limits.route_name(app.view_functions["/b"]).endswith(".handler#2")


def test_set_override_on_the_key_function_s_key_applies_to_a_decorated_route(limiter: Limiter) -> None:
    app = Flask("overrides")
    limits = FlaskLimits(limiter, app, warm_up=0)

    @app.get("/report")
    @limits.limit("api", key=user)
    def report() -> str:
        return "report"

    limiter.set_override("user:1", "api", "1/hour")
    client = app.test_client()
    assert [client.get("/report").status_code for _ in range(2)] == [200, 429]


def test_deduct_when_per_limit(limiter: Limiter) -> None:
    # only failed logins count against "2/hour"; every request counts against "5/hour"
    app = Flask("deduct")
    limits = FlaskLimits(limiter, app, warm_up=0)
    status = {"code": 200}

    @app.post("/login")
    @limits.limit("2/hour", key=user, deduct_when=lambda r: r.status_code >= 400)
    @limits.limit("5/hour", key=user)
    def login() -> tuple[str, int]:
        return "x", status["code"]

    client = app.test_client()
    assert [client.post("/login").status_code for _ in range(3)] == [200, 200, 200]
    status["code"] = 401
    # the successes gave their "2/hour" units back: two failures still fit
    assert [client.post("/login").status_code for _ in range(2)] == [401, 401]
    assert client.post("/login").status_code == 429


def test_deduct_when_of_one_limit_gives_back_only_its_units(limiter: Limiter) -> None:
    app = Flask("deduct-one")
    limits = FlaskLimits(limiter, app, warm_up=0)

    @app.post("/login")
    @limits.limit("2/hour", key=user, deduct_when=lambda r: r.status_code >= 400)
    @limits.limit("3/hour", key=user)
    def login() -> str:
        return "ok"

    client = app.test_client()
    # successes never count against "2/hour", but do against "3/hour"
    assert [client.post("/login").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_an_app_wide_default_is_relaxed_for_one_route(limiter: Limiter) -> None:
    app = Flask("relax")
    limits = FlaskLimits(limiter, app, policy="default", warm_up=0)

    @app.get("/search")
    @limits.limit("4/hour", key=user, override_defaults=True)
    def search() -> str:
        return "search"

    @app.get("/other")
    def other() -> str:
        return "other"

    client = app.test_client()
    assert [client.get("/search").status_code for _ in range(5)] == [200] * 4 + [429]
    assert [client.get("/other").status_code for _ in range(3)] == [200, 200, 429]


def test_a_limit_on_a_blueprint_limits_its_routes(limiter: Limiter) -> None:
    app = Flask("bp")
    limits = FlaskLimits(limiter, app, warm_up=0)
    bp = Blueprint("admin", "bp", url_prefix="/admin")
    limits.limit("2/hour", key=user)(bp)

    @bp.get("/a")
    def a() -> str:
        return "a"

    @bp.get("/b")
    def b() -> str:
        return "b"

    app.register_blueprint(bp)
    client = app.test_client()
    assert [client.get(p).status_code for p in ("/admin/a", "/admin/b", "/admin/a")] == [200, 200, 429]


def test_a_websocket_route_is_limited_when_it_opens(limiter: Limiter) -> None:
    limits = RouteLimits(limiter, key=user)

    @limits.limit("1/hour")
    async def feed(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    app = RateLimitMiddleware(Starlette(routes=[WebSocketRoute("/feed", feed)]), limiter,
                              routes=limits, warm_up=0)
    first = open_websocket(app, "/feed")
    assert [m["type"] for m in first] == ["websocket.accept", "websocket.send", "websocket.close"]
    second = open_websocket(app, "/feed")
    assert [(m["type"], m.get("code")) for m in second] == [("websocket.close", 1008)]


def test_a_decorator_without_a_middleware_refuses_to_run_unlimited(limiter: Limiter) -> None:
    limits = RouteLimits(limiter)

    @limits.limit("5/minute")
    async def login(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    with pytest.raises(RuntimeError, match="no middleware enforces"):
        get(Starlette(routes=[Route("/login", login)]), "/login")
    # once a middleware takes the limits, the route runs (and is limited)
    limited = RateLimitMiddleware(Starlette(routes=[Route("/login", login)]), limiter,
                                  routes=limits, warm_up=0)
    assert get(limited, "/login").status_code == 200


def lifespan_start_up(app: Any) -> list[dict[str, Any]]:
    """Runs the ASGI lifespan start-up of ``app`` as a server does: what the app sent."""
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)

    asyncio.run(main())
    return sent


def test_route_limits_that_no_middleware_enforces_fail_the_app_at_start_up(limiter: Limiter) -> None:
    limits = RouteLimits(limiter)

    @limits.limit("5/minute")
    async def login(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    # a middleware for the app's default limit, but the decorators' RouteLimits not given to
    # it: the app does not start, and says which middleware argument is missing
    app = Starlette(routes=[Route("/login", login)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, policy="default", warm_up=0)
    sent = lifespan_start_up(app)
    assert sent[0]["type"] == "lifespan.startup.failed", sent
    assert "login (/login)" in sent[0]["message"]
    assert "RateLimitMiddleware(routes=...)" in sent[0]["message"]
    # given to the middleware, the app starts
    app = Starlette(routes=[Route("/login", login)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, routes=limits, warm_up=0)
    assert lifespan_start_up(app)[0]["type"] == "lifespan.startup.complete"
    # a mounted app that has its own middleware for its limits starts too (Starlette makes
    # that middleware on the mounted app's first request, after the start-up)
    mounted_limits = RouteLimits(limiter)

    @mounted_limits.limit("5/minute")
    async def feed(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/feed", feed)])
    inner.add_middleware(RateLimitMiddleware, limiter=limiter, routes=mounted_limits, warm_up=0)
    outer = Starlette(routes=[Mount("/in", app=inner)])
    outer.add_middleware(RateLimitMiddleware, limiter=limiter, policy="default", warm_up=0)
    assert lifespan_start_up(outer)[0]["type"] == "lifespan.startup.complete"


def test_flask_route_limits_that_no_bound_flasklimits_enforces_fail_the_first_request(
        limiter: Limiter) -> None:
    # a FlaskLimits bound to another app, used on this app's view and Blueprint: before,
    # they ran unlimited, silently (the decorator's FlaskLimits counted as installed)
    other = FlaskLimits(limiter, Flask("other"), key=user, warm_up=0)

    def make_app(bind_other: bool) -> Flask:
        app = Flask(__name__)
        app.testing = True  # (the RuntimeError reaches the test instead of a 500)
        FlaskLimits(limiter, app, key=user, warm_up=0)  # this app's, for other limits
        if bind_other:
            other.init_app(app)

        @app.get("/login")
        @other.limit("1/hour")
        def login() -> str:
            return "ok"

        bp = Blueprint("admin", __name__)
        other.limit("1/hour")(bp)
        bp.add_url_rule("/a", "a", lambda: "a")
        app.register_blueprint(bp, url_prefix="/admin")
        app.add_url_rule("/health", "health", lambda: "ok")
        return app

    app = make_app(bind_other=False)
    assert shardlimit.flask.unenforced_routes(app) == ["login (/login)", "Blueprint 'admin'"]
    client = app.test_client()
    for path in ("/health", "/login", "/health"):  # every request: the app is misconfigured
        with pytest.raises(RuntimeError, match="no FlaskLimits bound to this app enforces") as e:
            client.get(path)
        assert "login (/login)" in str(e.value) and "Blueprint 'admin'" in str(e.value)
    # bound to the app too, its limits are enforced there, and the app serves
    app = make_app(bind_other=True)
    assert shardlimit.flask.unenforced_routes(app) == []
    client = app.test_client()
    assert [client.get(p).status_code for p in ("/health", "/login", "/login", "/admin/a", "/admin/a")] == [
        200, 200, 429, 200, 429]


@pytest.mark.parametrize("kwargs, named", [
    ({"cost": None}, "cost"),
    ({"cost": 0}, "cost"),
    ({"key": "user"}, "key"),
    ({"scope": ""}, "scope"),
    ({"deduct_when": 401}, "deduct_when"),
])
def test_a_bad_decorator_argument_is_an_error_naming_it(limiter: Limiter, kwargs: dict[str, Any],
                                                        named: str) -> None:
    limits = RouteLimits(limiter)
    with pytest.raises(shardlimit.InvalidArgumentError, match=f"^{named}: "):
        limits.limit("5/minute", **kwargs)


def test_a_bad_limit_is_an_error_naming_it(limiter: Limiter) -> None:
    limits = RouteLimits(limiter)
    with pytest.raises(shardlimit.InvalidArgumentError, match="^limit: "):
        limits.limit(5)  # type: ignore[arg-type]


def test_a_cost_function_returning_none_is_an_error(limiter: Limiter) -> None:
    limits = RouteLimits(limiter, key=user)
    cost: Callable[[Any], Any] = lambda request: None

    @limits.limit("5/minute", cost=cost)
    async def route(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = RateLimitMiddleware(Starlette(routes=[Route("/r", route)]), limiter, routes=limits,
                              warm_up=0)
    with pytest.raises(shardlimit.InvalidArgumentError, match="^cost: "):
        get(app, "/r")


def test_the_readme_s_deduct_when_and_override_defaults_snippet_runs_as_written(
        redis: RedisServer) -> None:
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Counting only failed requests"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    limiter = Limiter.from_json(config([redis], {
        "api": {"algorithm": "fixed_window", "limit": 2, "window": "1h"}}))
    ns: dict[str, Any] = {"__name__": "readme", "limiter": limiter}
    exec(compile(code.group(1), "README.md (deduct_when)", "exec"), ns)
    client = ns["app"].test_client()
    # the app-wide "api" (2) limits /login; its failures count against "5/minute" too
    assert [client.post("/login").status_code for _ in range(3)] == [401, 401, 429]
    # /search is not under "api": 1000/hour only
    assert [client.get("/search").status_code for _ in range(4)] == [200] * 4


def test_cost_none_is_an_error_not_one(limiter: Limiter) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: limiter.check("k", "api", None),  # type: ignore[arg-type]
        lambda: limiter.check("k", "api", cost=None),  # type: ignore[arg-type]
        lambda: limiter.charge("k", "api", None),  # type: ignore[arg-type]
        lambda: limiter.check_all([("k", "api", None)]),  # type: ignore[list-item]
        lambda: asyncio.run(limiter.acheck("k", "api", None)),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(shardlimit.InvalidArgumentError, match="`cost`: None"):
            call()
    assert limiter.check("k", "api").remaining == 99  # left out: 1
