"""Synchronous sampling and minibatch SGD (RLlib's PPO ``training_step``: synchronous
parallel sampling, advantage standardisation, multi-GPU minibatch SGD), top to bottom.

One step: broadcast the learner's weights once (one ref, many ``set_weights``), so every
sample of the step comes from the current policy; sample from every worker in parallel,
round after round, until at least ``train_batch_size`` env steps are in hand (each worker
postprocesses its fragments with GAE: ``advantages``, ``value_targets``); then the learner
fetches those samples straight from the workers and runs the epochs of minibatch SGD
(:meth:`actorrl.learner.actor.LearnerActor.learn_on_train_batch`), adapting each policy's
KL coefficient at the end. The broadcast carries the run's env-step count
(``global_timestep``, restored steps included) for the workers' schedules. With no remote
workers (``num_workers: 0``) the learner's own local worker samples and no weights need
broadcasting.

A rollout worker that dies is counted and replaced in its slot (the trainer's
``replace_worker`` starts a new one with the learner's weights); the samples the others
returned in that round are kept, and the replacement samples from the next round on. A
worker that dies after its sample was taken, before the learner fetched it, costs only its
share: the others' samples are kept and the missing rows sampled again
(:meth:`~actorrl.pipelines.pieces.SyncFleetMixin._learn_on_samples`).
"""

from __future__ import annotations

from typing import Any

from actorrl.pipelines.pieces import (
    SYNC_CALL_TIMEOUT_S,
    ReplaceWorker,
    SyncFleetMixin,
)
from actorrl.runtime import ActorHandle, Runtime
from actorrl.util.stats import TimerStat

CALL_TIMEOUT_S = SYNC_CALL_TIMEOUT_S
"""Longest wait for one round of samples or one learner step."""


class SyncSamplesOptimizer(SyncFleetMixin):
    """The synchronous PPO pipeline over remote workers (or the learner's local worker,
    ``sample_locally``) and a learner actor."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                 *, train_batch_size: int, sample_locally: bool = False,
                 replace_worker: ReplaceWorker | None = None) -> None:
        if train_batch_size < 1:
            raise ValueError(f"train_batch_size must be >= 1, got {train_batch_size}")
        self._attach_sync(runtime, workers, learner, replace_worker,
                          sample_locally=sample_locally,
                          no_workers="the PPO pipeline needs remote workers or "
                                     "sample_locally=True (the learner's local worker samples)")
        self.train_batch_size = train_batch_size
        self.learn_timer = TimerStat()
        self.fetch_time_s = 0.0

    async def step(self) -> dict[str, Any]:
        """Sample at least ``train_batch_size`` env steps with the current weights and
        learn on them; returns the learner stats."""
        with self.update_weights_timer:
            if self.workers:
                await self._broadcast_weights()
        result, rows = await self._learn_on_samples(
            self.learner.learn_on_train_batch_refs.remote, self.train_batch_size,
            self.learn_timer)
        self.learn_timer.push_units_processed(result["count"])
        self.fetch_time_s = float(result.get("fetch_time_s", 0.0))
        stats = result["learner_stats"]
        self.learner_stats = (stats.get("default_policy", stats) if len(stats) == 1
                              else stats)
        self.counters.num_steps_sampled += rows
        self.counters.num_steps_trained += result["count"]
        return self.learner_stats

    async def stats(self) -> dict[str, Any]:
        """Counters, timings (ms) and throughputs, and the last step's learner stats."""
        return {
            **self.counters.stats(),
            "num_worker_failures": self.num_worker_failures,
            "num_samples_dropped": self.num_samples_dropped,
            "sample_time_ms": round(1000 * self.sample_timer.mean, 3),
            "learn_time_ms": round(1000 * self.learn_timer.mean, 3),
            "update_time_ms": round(1000 * self.update_weights_timer.mean, 3),
            "fetch_time_ms": round(1000 * self.fetch_time_s, 3),
            "sample_throughput": round(self.sample_timer.mean_throughput, 3),
            "learn_throughput": round(self.learn_timer.mean_throughput, 3),
            "learner": self.learner_stats,
        }

    async def stop(self) -> None:
        """Nothing runs between steps."""
