"""Bounded waits on conditions the code under test makes observable."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

POLL_S = 0.01


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Return once ``condition()`` holds (checked every loop pass and every ``POLL_S``);
    fail naming ``what`` after ``timeout_s``. For states with no event to await."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(POLL_S)
