"""Small pieces the pipelines share: in-flight task pools and step counters."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from actorrl.runtime import ActorHandle, ObjectRef, Runtime
from transport.timeouts import wait_for


class Wakeup:
    """An event several task pools set when any of their tasks finishes, so a pipeline
    step can sleep until there is something to do."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout_s: float | None) -> None:
        """Wait until something finished (or ``timeout_s`` passed), then re-arm."""
        if not self.event.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_for(self.event.wait(), timeout_s)
        self.event.clear()


class TaskPool:
    """Calls in flight, each tagged with the actor running it (RLlib's TaskPool).

    Readiness is pushed by the runtime (no polling): :meth:`completed` returns the finished
    ``(actor, ref)`` pairs in the order they finished.
    """

    def __init__(self, wakeup: Wakeup | None = None) -> None:
        self._runtime = Runtime.current()
        self._wakeup = wakeup
        self._tasks: dict[ObjectRef, ActorHandle] = {}
        self._ready: deque[ObjectRef] = deque()
        self._event = asyncio.Event()

    def add(self, actor: ActorHandle, ref: ObjectRef) -> None:
        """Track ``ref``, the result of a call on ``actor``."""
        self._tasks[ref] = actor
        self._runtime.on_ready(ref, lambda r=ref: self._on_ready(r))

    def _on_ready(self, ref: ObjectRef) -> None:
        if ref in self._tasks:
            self._ready.append(ref)
            self._event.set()
            if self._wakeup is not None:
                self._wakeup.event.set()

    async def completed(self, timeout_s: float | None = None
                        ) -> list[tuple[ActorHandle, ObjectRef]]:
        """Every finished task, waiting up to ``timeout_s`` for the first (None: forever,
        0: don't wait)."""
        if not self._ready and timeout_s != 0 and self._tasks:
            try:
                await wait_for(self._event.wait(), timeout_s)
            except TimeoutError:
                pass
        out = []
        while self._ready:
            ref = self._ready.popleft()
            actor = self._tasks.pop(ref, None)
            if actor is not None:
                out.append((actor, ref))
        self._event.clear()
        return out

    def reset_workers(self, workers: Iterable[ActorHandle]) -> None:
        """Forget tasks of actors not in ``workers``."""
        keep = set(workers)
        for ref, actor in list(self._tasks.items()):
            if actor not in keep:
                del self._tasks[ref]

    def remove_actor(self, actor: ActorHandle) -> None:
        """Forget every task of ``actor``."""
        for ref, owner in list(self._tasks.items()):
            if owner == actor:
                del self._tasks[ref]

    def count_for(self, actor: ActorHandle) -> int:
        """Tasks in flight on ``actor``."""
        return sum(1 for a in self._tasks.values() if a == actor)

    @property
    def count(self) -> int:
        """Tasks in flight."""
        return len(self._tasks)


@dataclass
class StepCounters:
    """Steps sampled and trained, shared by every pipeline (RLlib's PolicyOptimizer
    counters)."""

    num_steps_sampled: int = 0
    num_steps_trained: int = 0
    started_s: float = field(default_factory=time.perf_counter)

    def stats(self) -> dict[str, Any]:
        """RLlib's base optimizer stats."""
        return {"num_steps_sampled": self.num_steps_sampled,
                "num_steps_trained": self.num_steps_trained}


class StepCountersMixin:
    """The PolicyOptimizer step-count surface, read from a pipeline's ``counters``."""

    counters: StepCounters

    @property
    def num_steps_sampled(self) -> int:
        """Env steps sampled so far."""
        return self.counters.num_steps_sampled

    @property
    def num_steps_trained(self) -> int:
        """Env steps trained on so far (for A3C: whose gradients were applied)."""
        return self.counters.num_steps_trained
