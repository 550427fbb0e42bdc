"""transport.timeouts.wait_for: a timed wait that cannot swallow a cancellation (Python
3.11's asyncio.wait_for does when the awaited thing finishes in the same loop pass)."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from actorrl.pipelines.pieces import Wakeup
from transport.timeouts import wait_for

ROOT = pathlib.Path(__file__).resolve().parent.parent


async def _cancel_while_event_fires(waiter) -> str:
    """Run a loop that waits on an event with ``waiter``; set the event and cancel the
    loop's task in the same pass. Returns how the loop ended."""
    event = asyncio.Event()
    passes = 0

    async def loop() -> str:
        nonlocal passes
        while passes < 20:
            await waiter(event)
            event.clear()
            passes += 1
        return "ran on after cancel"

    task = asyncio.ensure_future(loop())
    await asyncio.sleep(0)  # one loop pass: the task runs up to its first wait
    event.set()
    task.cancel()
    try:
        return await wait_for(asyncio.shield(task), 10)
    except asyncio.CancelledError:
        return "cancelled"


async def _timed_event_wait(event: asyncio.Event) -> None:
    try:
        await wait_for(event.wait(), 0.05)
    except TimeoutError:
        pass


async def test_a_cancel_in_the_same_pass_as_the_event_is_not_lost():
    for _ in range(20):
        assert await _cancel_while_event_fires(_timed_event_wait) == "cancelled"


async def test_a_pipeline_wakeup_loop_stops_when_cancelled():
    wakeup = Wakeup()

    async def waiter(event: asyncio.Event) -> None:
        wakeup.event = event
        await wakeup.wait(0.05)

    for _ in range(20):
        assert await _cancel_while_event_fires(waiter) == "cancelled"


async def test_result_timeout_and_no_limit():
    assert await wait_for(asyncio.sleep(0, "done"), 1.0) == "done"
    with pytest.raises(TimeoutError):
        await wait_for(asyncio.Event().wait(), 0.05)
    with pytest.raises(TimeoutError):
        await wait_for(asyncio.Event().wait(), -1)  # a past deadline: times out at once
    assert await wait_for(asyncio.sleep(0.01, 7), None) == 7


def test_no_module_uses_asyncio_wait_for():
    """Every timed wait in the library goes through transport.timeouts.wait_for."""
    offenders = [str(path.relative_to(ROOT))
                 for folder in ("actorrl", "transport") for path in (ROOT / folder).rglob("*.py")
                 if path.name != "timeouts.py" and "asyncio.wait_for(" in path.read_text()]
    assert offenders == []
