"""A3C's dataflow (RLlib's AsyncGradientsOptimizer), read top to bottom.

Each worker gets the current weights, then ``compute_gradients_ref(sample())`` chained on
the worker: the sample ref resolves inside the worker, so the sample never leaves it, and
the gradients stay there too (the reply is only a ref and ``info``). The coordinator waits
on the first ready gradient, has the learner fetch and apply it, and sends that worker the
learner's fresh weights (a ref the worker fetches from the learner; the worker's queue keeps
the order set_weights -> sample -> compute_gradients) before dispatching it again, until
``grads_per_step`` gradients were applied.
"""

from __future__ import annotations

import logging
from typing import Any

from actorrl.messages import GradientsApplied, GradientsReply
from actorrl.pipelines.pieces import (
    FleetPipelineMixin,
    ReplaceWorker,
    TaskPool,
    require_at_least_one,
)
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectLostError, ObjectRef, Runtime
from actorrl.util.stats import TimerStat

log = logging.getLogger(__name__)


class AsyncGradientsOptimizer(FleetPipelineMixin):
    """The A3C pipeline over remote workers and a learner actor that applies gradients."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                 *, grads_per_step: int, replace_worker: ReplaceWorker | None = None
                 ) -> None:
        self._attach(runtime, workers, learner, replace_worker,
                     no_workers="the async gradients optimizer (A3C) requires at least 1 "
                                "remote worker: set num_workers >= 1")
        require_at_least_one("grads_per_step", grads_per_step)
        self.grads_per_step = grads_per_step
        self.apply_timer = TimerStat()
        self.wait_timer = TimerStat()
        self.dispatch_timer = TimerStat()
        self.learner_stats: dict[str, Any] = {}
        self.num_gradients_lost = 0
        self.weights_version = 0

    def _dispatch(self, pool: TaskPool, worker: ActorHandle, weights: ObjectRef) -> None:
        # The step count rides along: workers compute the gradients, so their policies
        # need it for entropy_coeff_schedule.
        worker.set_weights.remote(weights, self.counters.global_timestep)
        sample = worker.sample.remote()
        pool.add(worker, worker.compute_gradients_ref.remote(sample))

    async def step(self) -> dict[str, Any]:
        """Apply ``grads_per_step`` gradients; returns the last learner stats. The learner's
        calls are watched in the same pool as the workers', so a dead learner fails the
        step at once (``ActorDiedError``) instead of leaving workers waiting on it."""
        pool = TaskPool(self.runtime)
        weights = self._learner_call(pool, self.learner.get_weights.remote())
        dispatched = 0
        for worker in self.workers:
            self._dispatch(pool, worker, weights)
            dispatched += 1
        applied: dict[ObjectRef, int] = {}  # apply call -> its env steps
        while pool.count:
            with self.wait_timer:
                completed = await pool.completed(timeout_s=None)
            for worker, ref in completed:
                if worker == self.learner:
                    await self._on_learner_call(ref, applied.pop(ref, None))
                    continue
                try:
                    reply: GradientsReply = await self.runtime.get_async(ref)
                except ActorDiedError as exc:
                    new = await self.worker_fleet.failed(worker, exc, lambda _w: None)
                    if new is not None and dispatched < self.grads_per_step:
                        self._dispatch(pool, new, self._learner_call(
                            pool, self.learner.get_weights.remote()))
                        dispatched += 1
                    continue
                self.learner_stats = reply.info.get("learner_stats", reply.info)
                apply = self._learner_call(
                    pool, self.learner.apply_gradients_refs.remote([reply.grads]))
                applied[apply] = reply.batch_count
                self.counters.num_steps_sampled += reply.batch_count
                if dispatched < self.grads_per_step:
                    with self.dispatch_timer:
                        # The weights once this worker's gradient is applied (RLlib's order).
                        self._dispatch(pool, worker, self._learner_call(
                            pool, self.learner.get_weights_after.remote([apply])))
                    dispatched += 1
        return self.learner_stats

    def _learner_call(self, pool: TaskPool, ref: ObjectRef) -> ObjectRef:
        """Watch a call on the learner in ``pool``; returns ``ref``."""
        pool.add(self.learner, ref)
        return ref

    async def _on_learner_call(self, ref: ObjectRef, env_steps: int | None) -> None:
        """A learner call finished. A dead learner raises ``ActorDiedError``. An apply
        (``env_steps`` given) counts its env steps when it took effect (a worker that died
        before the learner fetched its gradient lost it)."""
        try:
            done = await self.runtime.get_async(ref)
        except ObjectLostError as exc:
            if env_steps is not None:
                self.num_gradients_lost += 1  # in the stats; the worker's failure is logged
                log.debug("a gradient was lost with its worker: %s", exc)
            return
        if env_steps is not None:
            assert isinstance(done, GradientsApplied)
            self.apply_timer.push(done.apply_time_s)
            self.weights_version = max(self.weights_version, done.version)
            self.counters.num_steps_trained += env_steps

    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set (takes effect at the next step)."""
        self.worker_fleet.actors = list(workers)

    async def stats(self) -> dict[str, Any]:
        """RLlib's AsyncGradientsOptimizer stats."""
        return {
            **self.counters.stats(),
            "wait_time_ms": round(1000 * self.wait_timer.mean, 3),
            "apply_time_ms": round(1000 * self.apply_timer.mean, 3),
            "dispatch_time_ms": round(1000 * self.dispatch_timer.mean, 3),
            "num_worker_failures": self.num_worker_failures,
            "num_gradients_lost": self.num_gradients_lost,
            "learner": self.learner_stats,
        }

    async def stop(self) -> None:
        """Nothing runs between steps."""
