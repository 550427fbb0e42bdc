"""The event loop a runtime runs on, and the one thread that runs it."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    """A runtime's event loop and the thread running it: the parts that may be called
    from other threads ask :meth:`on_loop` to choose between acting at once and handing
    the work to the loop. Made on the loop's thread."""

    __slots__ = ("loop", "thread_id")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread_id = threading.get_ident()

    def on_loop(self) -> bool:
        """True when called from the loop's thread."""
        return threading.get_ident() == self.thread_id
