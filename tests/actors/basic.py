"""Small actors for runtime tests."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import numpy as np

import actorrl.runtime as rt


class Counter:
    """Keeps a running total; records the order of calls."""

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.seen: list[int] = []

    def add(self, n: int) -> int:
        self.total += n
        self.seen.append(n)
        return self.total

    def history(self) -> list[int]:
        return self.seen

    def pid(self) -> int:
        return os.getpid()

    def noop(self) -> None:
        return None

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def echo(self, value: Any) -> Any:
        return value

    def stored(self) -> int:
        """Objects this actor's process holds (call results not freed yet)."""
        return len(rt.Runtime.current().store)


class Gate:
    """Methods that finish when told to, to control completion order."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}

    def _event(self, key: str) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())

    async def wait_for(self, key: str, value: Any) -> Any:
        await self._event(key).wait()
        return value

    async def open(self, key: str) -> None:
        self._event(key).set()

    def pid(self) -> int:
        return os.getpid()


class Store:
    """Produces and consumes large arrays; reports its transport byte counters."""

    def __init__(self) -> None:
        self.kept: Any = None

    def make(self, nbytes: int) -> dict[str, np.ndarray]:
        return {"a": np.ones(nbytes // 8, dtype=np.float64)}

    def consume(self, value: dict[str, np.ndarray]) -> float:
        self.kept = value
        return float(sum(v.sum() for v in value.values()))

    def same_object(self, value: Any, ref_value_id: int) -> bool:
        return id(value) == ref_value_id

    def remember(self, value: Any) -> int:
        self.kept = value
        return id(value)

    def is_kept(self, value: Any) -> bool:
        return value is self.kept

    def bytes_received(self) -> int:
        runtime = rt.Runtime.current()
        return runtime.bytes_received

    def threads(self) -> int:
        return threading.active_count()


class Relay:
    """Holds a ref from another actor and passes it on without touching its value."""

    def forward(self, target: rt.ActorHandle, refs: list[rt.ObjectRef]) -> float:
        return rt.get(target.consume.remote(refs[0]), timeout=60)

    def call(self, target: rt.ActorHandle, method: str, args: list[Any]) -> Any:
        """Call ``target.method(*args)`` from this actor and return its result (a failure
        there is raised here, so it reaches our caller forwarded)."""
        return rt.get(getattr(target, method).remote(*args), timeout=60)

    def bytes_received(self) -> int:
        runtime = rt.Runtime.current()
        return runtime.bytes_received


class Broken:
    """An actor whose constructor fails."""

    def __init__(self) -> None:
        raise RuntimeError("constructor exploded")


class NeverBuilt:
    """An actor whose constructor does not return for two minutes: a creation its caller
    gives up on, however fast processes start."""

    def __init__(self) -> None:
        threading.Event().wait(120)


class SlowBuilt(Counter):
    """A :class:`Counter` whose constructor takes ``seconds`` (a creation slower than a
    client session's timeout)."""

    def __init__(self, seconds: float) -> None:
        threading.Event().wait(seconds)
        super().__init__(0)


class Putter:
    """Puts a value inside a method and has another actor read it before returning."""

    def roundtrip(self, target: rt.ActorHandle, nbytes: int) -> float:
        ref = rt.put({"a": np.ones(nbytes // 8)})
        return rt.get(target.consume.remote(ref), timeout=30)
