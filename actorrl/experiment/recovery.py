"""A local ``actorrl train`` that survives the death of an actor its pipeline cannot
replace (the learner, a replay shard the pipeline does not replace, ...).

:class:`RecoveringTrainer` is what :func:`~actorrl.algorithms.run_loop.run_trainer` drives
for a local run: it trains the current :class:`~actorrl.algorithms.Trainer` and, when an
iteration fails because an actor process died (:class:`ActorDiedError`), counts the failure
in the run's :class:`~actorrl.algorithms.restarts.FailureWindow`, replaces what died and
restores the last checkpoint (or the ``--restore`` checkpoint, or nothing), then trains on.
Only what died is replaced: the failed trainer's rollout workers and replay shards that
still answer are handed to the new trainer (:meth:`~actorrl.algorithms.Trainer.salvage`),
so an Ape-X learner loss keeps the replay contents and learning resumes without waiting for
``learning_starts`` again; the learner always starts afresh from the checkpoint. Over the
limit, the iteration fails with :class:`RestartLimitError` naming the limit and the last
failure.

After a restart the counters are the checkpoint's: the iterations and env steps of the
lost work are not counted again (``training_iteration`` resumes at the checkpoint's next
iteration). Each later result says so in ``info``: ``num_restarts``,
``restored_iteration`` (the iteration it rolled back to), ``timesteps_lost`` (env steps of
reported results that the rollbacks undid) and ``timesteps_sampled_all``
(``timesteps_total`` plus those: every env step sampled, the lost ones included, as far as
results reported them). The failure counters of ``info`` (``num_worker_restarts``, ...)
continue across restarts.

Other errors (a bug in a loss, a bad env) are not restarted: they would fail again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from actorrl.algorithms import Trainer
from actorrl.algorithms.restarts import (
    CarriedCounters,
    FailureWindow,
    RestartPolicy,
    Rollbacks,
    describe_failure,
)
from actorrl.algorithms.trainer import Survivors
from actorrl.experiment.errors import error_summary
from actorrl.runtime.errors import ActorDiedError
from transport.timeouts import wait_for

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
"""Deadline for stopping a failed trainer's actors before building the next one."""

Rebuild = Callable[[Survivors | None], Awaitable[Trainer]]
"""Builds a fresh trainer for the same config, taking over the live actors of the failed
one when given (:class:`~actorrl.algorithms.trainer.Survivors`) and starting the rest."""
StateSource = Callable[[], Awaitable[dict[str, Any] | None]]
"""The state a fresh trainer restores: the last checkpoint's, or None (from scratch)."""


class RestartLimitError(RuntimeError):
    """A run failed more often than its restart policy allows."""


def is_recoverable(exc: BaseException) -> bool:
    """Whether a failed iteration is worth a restart: an actor process died (its state is
    gone; a fresh one from the checkpoint can carry on)."""
    return isinstance(exc, ActorDiedError)


class RecoveringTrainer:
    """Trains ``trainer``; restarts it from the last checkpoint when an actor dies (see the
    module docstring). ``notify`` receives one line per restart for the user."""

    def __init__(self, trainer: Trainer, *, rebuild: Rebuild, state: StateSource,
                 policy: RestartPolicy, notify: Callable[[str], None]) -> None:
        self.trainer: Trainer | None = trainer
        """The live trainer (None while a restart builds the next one)."""
        self._rebuild = rebuild
        self._state = state
        self.failures = FailureWindow(policy)
        self.counters = CarriedCounters()
        self._notify = notify
        self.rollbacks = Rollbacks()
        """The restarts so far and how later results say so (shared with cluster jobs)."""
        self._iteration = trainer.iteration

    @property
    def num_restarts(self) -> int:
        """Restarts from a checkpoint so far."""
        return self.rollbacks.num_restarts

    @property
    def iteration(self) -> int:
        """Iterations done so far (the current trainer's, after a restart the
        checkpoint's plus what was done since)."""
        if self.trainer is not None:
            self._iteration = self.trainer.iteration
        return self._iteration

    async def train(self) -> dict[str, Any]:
        """One iteration's result, restarting (as often as the policy allows) when an
        actor died during it."""
        while True:
            trainer = self.trainer
            try:
                if trainer is None:
                    raise RuntimeError("no trainer to train")  # never: restarts set one
                result = await trainer.train()
            except Exception as exc:
                if not is_recoverable(exc):
                    raise
                await self._restart(exc)
                continue
            self.counters.apply(result)
            self.rollbacks.mark(result)
            return result

    async def _restart(self, failure: BaseException) -> None:
        """Replace the trainer after ``failure``, retrying while the rebuild itself loses
        actors; raises :class:`RestartLimitError` over the policy's limit."""
        while True:
            decision = self.failures.record()
            if not decision.restart:
                raise RestartLimitError(f"{describe_failure(failure)} ({decision.describe()}; "
                                        "--max-failures and --failure-window set the "
                                        "limit)") from failure
            self._notify(f"{describe_failure(failure)}: {decision.describe()} from the "
                         "last checkpoint")
            survivors = await self._salvage()
            self.counters.restarted()
            await asyncio.sleep(decision.delay_s)  # the backoff, not a synchronisation
            try:
                trainer = await self._rebuild(survivors)
            except Exception as exc:
                if not is_recoverable(exc):
                    raise
                failure = exc
                continue
            self.trainer = trainer
            try:
                state = await self._state()
                if state is not None:
                    await trainer.set_state(state)
            except Exception as exc:
                if not is_recoverable(exc):
                    raise
                failure = exc
                continue
            restored = int(state.get("timesteps_total", 0)) if state is not None else 0
            self.rollbacks.restored(trainer.iteration, restored)
            self._iteration = trainer.iteration
            where = (f"iteration {trainer.iteration}" if state is not None
                     else "scratch (no checkpoint yet)")
            reused = getattr(trainer, "reused", [])
            kept = (f", kept {len(reused)} live actor{'s' if len(reused) != 1 else ''} "
                    "(rollout workers, replay shards and their contents)" if reused else "")
            self._notify(f"restarted from {where}{kept}; training goes on (restart "
                         f"{self.num_restarts})")
            return

    async def _salvage(self) -> Survivors | None:
        """Take the live actors out of the failed trainer and stop the rest (bounded);
        None when the trainer cannot hand any over (it is then stopped whole)."""
        trainer = self.trainer
        salvage = getattr(trainer, "salvage", None)
        if trainer is None or salvage is None:
            await self.stop()
            return None
        self.trainer = None
        self._iteration = trainer.iteration
        try:
            return await wait_for(salvage(), STOP_TIMEOUT_S)
        except Exception as exc:
            log.warning("keeping the failed trainer's live actors: %s; starting all afresh",
                        error_summary(exc))
            try:
                await wait_for(trainer.stop(), STOP_TIMEOUT_S)
            except Exception as stop_exc:
                log.warning("stopping the failed trainer: %s", error_summary(stop_exc))
            return None

    async def stop(self) -> None:
        """Stop the live trainer's pipeline and actors (bounded; what is left is killed
        with the driver)."""
        trainer, self.trainer = self.trainer, None
        if trainer is None:
            return
        self._iteration = trainer.iteration
        try:
            await wait_for(trainer.stop(), STOP_TIMEOUT_S)
        except Exception as exc:
            log.warning("stopping the failed trainer: %s", error_summary(exc))
