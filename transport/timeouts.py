"""A timeout that never swallows a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the awaited result instead of raising
``CancelledError`` when the task is cancelled in the same loop pass as the awaited thing
finishes (fixed in 3.12). A loop that waits on a frequently set event with ``wait_for``,
such as a pipeline step, can then survive ``task.cancel()`` and run on forever.
``asyncio.timeout`` has no such window, so every timed wait in actorrl goes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``awaitable`` for at most ``timeout_s`` seconds (None: no limit); raises
    ``TimeoutError`` when the time is up, and lets a cancellation of the caller through."""
    if timeout_s is None:
        return await awaitable
    async with asyncio.timeout(max(timeout_s, 0.0)):
        return await awaitable
