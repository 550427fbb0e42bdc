"""The store of the objects one owner holds (this process, or a serial-mode actor in it).

Objects are kept by id as ``(status, value)``: :data:`STATUS_OK` with the value,
:data:`STATUS_ERROR` with the error a call raised; a request for an id that is freed (or
never existed) is answered :data:`STATUS_MISSING`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

STATUS_OK = 0
STATUS_ERROR = 1
STATUS_MISSING = 2

Waiter = Callable[[int, Any], None]
"""Called with ``(status, value)`` once an object exists."""

MAX_UNKNOWN_WAITS = 10_000
"""Ids asked for before anyone announced them that wait at once (each until its expiry);
beyond that a wait for an unknown id is answered "missing" immediately."""


class ObjectStore:
    """Objects of one owner: id -> (status, value), plus waiters for pending ids.

    A request for an id this store has never heard of waits up to ``unknown_wait_s``: the
    call that produces it may still be on its way (a consumer's fetch can overtake the
    producer's call on another connection). Ids freed recently answer MISSING at once.
    Single-threaded: used only from the process's event loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None,
                 unknown_wait_s: float = 60.0, remember_freed: int = 100_000,
                 on_drop: Callable[[bytes], None] | None = None) -> None:
        """``on_drop(object_id)`` runs when a stored object is freed (the owner drops the
        fetch replies it keeps for it)."""
        self._loop = loop
        self._on_drop = on_drop
        self._unknown_wait_s = unknown_wait_s
        self._objects: dict[bytes, tuple[int, Any]] = {}
        self._pending: dict[bytes, list[Waiter]] = {}
        self._free_on_completion: set[bytes] = set()
        # Expiry timers of ids asked for before anyone announced them.
        self._unknown_timers: dict[bytes, asyncio.TimerHandle] = {}
        self._freed: OrderedDict[bytes, None] = OrderedDict()
        self._remember_freed = remember_freed

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, object_id: bytes) -> bool:
        return object_id in self._objects or object_id in self._pending

    def add_pending(self, object_id: bytes) -> None:
        """Announce an object that will be produced later."""
        self._pending.setdefault(object_id, [])
        self._cancel_unknown_timer(object_id)  # known now: waiters wait however long it takes

    def set(self, object_id: bytes, status: int, value: Any) -> None:
        """Store a produced value (or error record) and wake its waiters."""
        waiters = self._pending.pop(object_id, ())
        self._cancel_unknown_timer(object_id)
        if object_id in self._free_on_completion:
            self._free_on_completion.discard(object_id)
            self._remember(object_id)
        else:
            self._objects[object_id] = (status, value)
        for waiter in waiters:
            try:
                waiter(status, value)
            except Exception:  # one broken waiter must not starve the others
                log.exception("a waiter of object %s failed", object_id.hex())

    def lookup(self, object_id: bytes) -> tuple[int, Any] | None:
        """The stored (status, value), or None when pending or unknown."""
        return self._objects.get(object_id)

    def when_ready(self, object_id: bytes, waiter: Waiter) -> None:
        """Call ``waiter(status, value)`` once the object exists (now if it does)."""
        found = self._objects.get(object_id)
        if found is not None:
            waiter(*found)
        elif object_id in self._pending:
            self._pending[object_id].append(waiter)
        elif (object_id in self._freed or self._loop is None
              or len(self._unknown_timers) >= MAX_UNKNOWN_WAITS):
            # (a flood of waits for ids nobody announced is answered "missing" at once)
            waiter(STATUS_MISSING, None)
        else:
            self._pending[object_id] = [waiter]
            self._unknown_timers[object_id] = self._loop.call_later(
                self._unknown_wait_s, self._expire_unknown, object_id)

    def remove_waiter(self, object_id: bytes, waiter: Waiter) -> None:
        """Forget a waiter that is no longer interested."""
        waiters = self._pending.get(object_id)
        if waiters and waiter in waiters:
            waiters.remove(waiter)

    def _cancel_unknown_timer(self, object_id: bytes) -> None:
        timer = self._unknown_timers.pop(object_id, None)
        if timer is not None:
            timer.cancel()

    def _expire_unknown(self, object_id: bytes) -> None:
        self._unknown_timers.pop(object_id, None)
        self._free_on_completion.discard(object_id)
        if object_id in self._pending and object_id not in self._objects:
            for waiter in self._pending.pop(object_id):
                waiter(STATUS_MISSING, None)

    def free(self, object_id: bytes) -> None:
        """Drop an object; a pending one is dropped as soon as it is produced."""
        if self._objects.pop(object_id, None) is not None:
            self._remember(object_id)
            if self._on_drop is not None:
                try:
                    self._on_drop(object_id)
                except Exception:
                    log.exception("dropping object %s failed", object_id.hex())
        elif object_id in self._pending:
            self._free_on_completion.add(object_id)

    def _remember(self, object_id: bytes) -> None:
        self._freed[object_id] = None
        if len(self._freed) > self._remember_freed:
            self._freed.popitem(last=False)

    def fail_pending(self, error: Any) -> None:
        """Fail every pending object with ``error`` (status ERROR)."""
        for object_id in list(self._pending):
            self.set(object_id, STATUS_ERROR, error)
