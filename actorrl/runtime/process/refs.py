"""Object references.

An :class:`ObjectRef` names an object by a 16-byte id and the endpoint of the process that
owns it (the one that produced it). The value stays with its owner until it is freed;
anyone holding the ref fetches it straight from the owner.

Lifetime: a ref created in a process by a call or ``put`` is *tracked*: it holds the
function that frees its object. When the last Python reference to it is dropped the owner
is told to free the object, unless the ref escaped inside a value sent to another process
(then only an explicit ``free`` releases it). Refs passed directly as call arguments are
kept alive until that call completes.

A ref's bookkeeping in this process (the call that produces it, a value that came with
the call's reply or a fetch, the fetch and the wait in flight) is changed through its
methods only; the runtime's parts read it through them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from typing import Any

from transport.codec import register_type
from transport.endpoint import short

Release = Callable[[str, bytes, bool], None]
"""``release(owner, object_id, soon)``: queue a free of ``object_id`` at ``owner`` (see
:meth:`FreeQueue.release <actorrl.runtime.process.frees.FreeQueue.release>`)."""

ready_order = itertools.count()
"""Completion order of refs (:meth:`ObjectRef.became_ready`): ``wait`` sorts the refs that
were ready before it by it (:func:`completion_order`)."""

_prefix = os.urandom(8)
_counter = itertools.count()
_counter_pid = os.getpid()


def new_object_id() -> bytes:
    """A fresh, globally unique 16-byte object id (random per process + a counter)."""
    global _prefix, _counter, _counter_pid
    if os.getpid() != _counter_pid:  # never reuse the parent's prefix after a fork
        _prefix, _counter, _counter_pid = os.urandom(8), itertools.count(), os.getpid()
    return _prefix + next(_counter).to_bytes(8, "little")


class ObjectRef:
    """A reference to a value owned by some process; resolve it with ``get``.

    Attributes other than ``id`` and ``owner`` are this process's bookkeeping, read and
    changed through the methods below.
    """

    __slots__ = ("id", "owner", "_release", "_escaped", "_call", "_found", "_ready_seq",
                 "_fetching", "_waiting", "__weakref__")

    def __init__(self, object_id: bytes, owner: str, release: Release | None = None) -> None:
        """``release``: for a ref created here by a call or a put, how to free its object
        once the ref is collected (None: an untracked ref, e.g. one that came in a
        value)."""
        self.id = object_id
        self.owner = owner
        self._release = release
        self._escaped = False
        self._call: asyncio.Future | None = None
        """The future of the call that produces the object, when this process made it."""
        self._found: tuple[int, Any] | None = None
        """``(status, value)`` once it came here (inline with a reply, or fetched)."""
        self._ready_seq = -1
        self._fetching: asyncio.Task | None = None
        """The one fetch in flight for this ref, shared by its gets."""
        self._waiting: asyncio.Task | None = None
        """The one readiness wait in flight for this ref, shared by its waits."""

    # ---- the call that produces it ---------------------------------------------------------
    def attach_call(self, call: asyncio.Future) -> None:
        """This ref's object is the result of a call this process submits: ``call`` is
        done once the call ended (its result is an ``[status, inline, value]`` reply)."""
        self._call = call

    @property
    def call(self) -> asyncio.Future | None:
        """The future of the call this process submitted to produce the object, if any."""
        return self._call

    @property
    def call_hooks(self) -> int:
        """Callbacks hooked on this ref's call while it runs (0 once none: a test hook,
        so tests can check that waits which gave up removed theirs)."""
        fut = self._call
        return len(getattr(fut, "_callbacks", None) or ()) if fut is not None else 0

    # ---- its value, here ----------------------------------------------------------------------
    def found(self) -> tuple[int, Any] | None:
        """``(status, value)`` when it is here (it came with the call's reply, or was
        fetched or put here), else None."""
        return self._found

    def became_ready(self, found: tuple[int, Any] | None = None) -> None:
        """The object exists now (its call ended, or it was put here): this orders it among
        the refs a ``wait`` finds ready. ``found``: its ``(status, value)``, when that came
        here too (inline with the call's reply, or put here): later gets need no fetch."""
        self._ready_seq = next(ready_order)
        if found is not None:
            self._found = found

    def fetch(self, start: Callable[[ObjectRef], asyncio.Task]) -> asyncio.Task:
        """The fetch of the value in flight, ``start(self)`` when there is none: one fetch
        per ref however many gets wait on it."""
        task = self._fetching
        if task is None:
            task = self._fetching = start(self)
        return task

    def fetched(self, status: int, value: Any) -> None:
        """The fetch in flight brought ``(status, value)``: kept, and the next fetch is a
        new one."""
        self._found = (status, value)
        self._fetching = None

    def readiness(self, start: Callable[[ObjectRef], asyncio.Task]) -> asyncio.Task:
        """The wait for the object to exist in flight, ``start(self)`` when there is none:
        one per ref however often it is waited on."""
        task = self._waiting
        if task is None:
            task = self._waiting = start(self)
        return task

    # ---- lifetime ---------------------------------------------------------------------------
    @property
    def escaped(self) -> bool:
        """Whether the ref was sent inside a value to another process (then only an
        explicit ``free`` releases its object)."""
        return self._escaped

    def sent_as_argument(self, was_escaped: bool) -> None:
        """Encoding a call made this direct argument escape; it did not (the callee
        resolves it before the method runs, and the call keeps it alive meanwhile): its
        flag is what it was, ``was_escaped``."""
        self._escaped = was_escaped

    def mark_freed(self) -> None:
        """This process released the object: its value is dropped here, and collecting
        the ref frees nothing more."""
        self._release = None
        self._found = None

    def hex(self) -> str:
        """The id as hex, for logs."""
        return self.id.hex()

    def __repr__(self) -> str:
        return f"ObjectRef({self.id.hex()[-12:]} @ {short(self.owner)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __del__(self) -> None:
        release = self._release
        if release is not None and not self._escaped:
            try:
                release(self.owner, self.id, False)
            except Exception:  # interpreter shutdown, closed loop: nothing to free
                pass


def completion_order(ref: ObjectRef) -> tuple[bool, int]:
    """Sort key of refs by when they became ready here (those never seen ready last)."""
    return ref._ready_seq < 0, ref._ready_seq


def _ref_to_wire(ref: ObjectRef) -> list[Any]:
    ref._escaped = True
    return [ref.id, ref.owner]


register_type(ObjectRef, "actorrl.ObjectRef", _ref_to_wire, lambda s: ObjectRef(s[0], s[1]))
