"""The coroutine behind every async call of the extension (``Limiter.acheck`` and the
others): the extension hands it a function that starts the call on the loop that awaits."""

from __future__ import annotations

from typing import Any, Awaitable, Callable


async def _run(start: Callable[[], Awaitable[Any]]) -> Any:
    return await start()
