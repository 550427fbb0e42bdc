"""The one training loop: train, hand each result to the sinks, stop on a criterion or a
request, checkpoint on a policy.

``actorrl train`` runs it on a local :class:`~actorrl.algorithms.Trainer`, ``actorrl train
--address`` on a job followed through the client (its "iterations" are the job's streamed
results), and a cluster job on the coordinator's Trainer. What differs between them is
passed in: the sinks (results folder and live display, or the job's record), the
:class:`~actorrl.algorithms.stop.StopCriteria`,
the :class:`CheckpointPolicy` (every N iterations, or
every N seconds, and a final one) and an optional :class:`StopRequest` (signals).

Exceptions of an iteration propagate (the caller decides: a failed run, or a job restarted
from its checkpoint); cancelling the calling task cancels the loop without a checkpoint.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from actorrl.algorithms.stop import StopCriteria

T = TypeVar("T")

ResultSink = Callable[[dict[str, Any]], Any]
"""Receives each result in turn (may add keys or correct counters in place for the sinks
and stop criteria after it)."""

DEFAULT_CHECKPOINT_INTERVAL_S = 10.0
"""Seconds of training between a local run's checkpoints unless told otherwise
(``actorrl train --checkpoint-interval``, ``job.checkpoint_interval_s``): a learner loss
rolls back at most this much training, plus the iteration in progress."""

FINISHED: Literal["finished"] = "finished"
INTERRUPTED: Literal["interrupted"] = "interrupted"
ENDED: Literal["ended"] = "ended"


class Trainable(Protocol):
    """What :func:`run_trainer` drives: a :class:`~actorrl.algorithms.Trainer`, or anything
    that produces results the same way."""

    @property
    def iteration(self) -> int:
        """Iterations done so far (a restored checkpoint's included)."""
        ...

    async def train(self) -> dict[str, Any] | None:
        """One iteration's result; None when the source ended by itself (a followed job
        that met its own criteria)."""
        ...


@dataclass(frozen=True, kw_only=True)
class CheckpointPolicy:
    """When :func:`run_trainer` calls ``save(final)``. A periodic checkpoint is due after
    every ``every_iterations``-th iteration, or (``every_s`` set) after the first iteration
    and then whenever ``every_s`` seconds have passed since the last one; the final one
    follows a met criterion or a stop request when ``final`` is set and the last iteration
    is not saved yet. With ``save`` None, nothing is saved."""

    save: Callable[[bool], Awaitable[Any]] | None = None
    every_iterations: int = 0
    every_s: float | None = None
    final: bool = True

    def due(self, iteration: int, since_last_s: float) -> bool:
        """Whether a periodic checkpoint is due after ``iteration``."""
        if self.save is None:
            return False
        if self.every_s is not None:
            return since_last_s >= self.every_s
        return self.every_iterations > 0 and iteration % self.every_iterations == 0


class Interrupted(Exception):
    """A stop was requested before the guarded work finished (it was cancelled)."""


class StopRequest:
    """A request to stop from outside the loop (a signal): the loop stops after the
    running iteration, or cancels it after a grace period."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        """Ask the loop to stop; ``reason`` names the cause (``"SIGINT"``)."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def requested(self) -> bool:
        """Whether :meth:`set` was called."""
        return self._event.is_set()

    async def guard(self, work: Awaitable[T], grace_s: float = 0.0) -> T:
        """Await ``work``; if a stop is requested first, give it ``grace_s`` more, then
        cancel it and raise :class:`Interrupted`."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and grace_s > 0:
                await asyncio.wait({task}, timeout=grace_s)
            if task.done():
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise Interrupted()
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()


@dataclass
class RunOutcome:
    """How :func:`run_trainer` ended."""

    status: Literal["finished", "interrupted", "ended"]
    """``finished``: a criterion was met; ``interrupted``: a stop was requested;
    ``ended``: the trainable ended by itself."""
    reason: str
    """Which criterion, or when the stop request came."""
    last_result: dict[str, Any] | None = None


async def run_trainer(trainer: Trainable, stop: StopCriteria, sinks: Sequence[ResultSink],
                      checkpoint_policy: CheckpointPolicy, *,
                      stop_request: StopRequest | None = None,
                      grace_s: float = 0.0) -> RunOutcome:
    """Train until a criterion of ``stop`` is met, ``stop_request`` is set (the running
    iteration gets ``grace_s`` to finish) or ``trainer`` ends; see the module docstring."""
    started = time.monotonic()
    last_save = -math.inf
    saved_iteration = trainer.iteration
    outcome = None
    result: dict[str, Any] | None = None
    while outcome is None:
        try:
            work = trainer.train()
            next_result = (await stop_request.guard(work, grace_s) if stop_request
                           else await work)
        except Interrupted:
            assert stop_request is not None
            outcome = RunOutcome(INTERRUPTED, f"{stop_request.reason} during iteration "
                                              f"{trainer.iteration + 1}", result)
            break
        if next_result is None:
            return RunOutcome(ENDED, "", result)
        result = next_result
        for sink in sinks:
            sink(result)
        reason = stop.reached(result, time.monotonic() - started)
        if reason is not None:
            outcome = RunOutcome(FINISHED, reason, result)
        elif stop_request is not None and stop_request.requested:
            outcome = RunOutcome(INTERRUPTED, f"{stop_request.reason} after iteration "
                                              f"{trainer.iteration}", result)
        elif checkpoint_policy.due(trainer.iteration, time.monotonic() - last_save):
            assert checkpoint_policy.save is not None
            await checkpoint_policy.save(False)
            last_save, saved_iteration = time.monotonic(), trainer.iteration
    if (checkpoint_policy.final and checkpoint_policy.save is not None
            and trainer.iteration not in (saved_iteration, 0)):
        await checkpoint_policy.save(True)
    return outcome
