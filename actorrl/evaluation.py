"""Evaluation during training (RLlib's ``evaluation_interval`` and friends).

Separate evaluation workers (rollout worker actors built from
:meth:`AlgorithmConfig.evaluation_worker_config`: ``explore`` off unless
``evaluation_config`` says otherwise) receive the learner's weights, sample until
``evaluation_duration`` episodes have finished (or env steps have been taken) across them,
and report the episodes' stats. Their batches never leave them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actorrl.callbacks import summarize_custom_metrics
from actorrl.config import WorkerConfig
from actorrl.envs import EpisodeMetrics
from actorrl.runtime import ActorHandle, DriverLike, ObjectRef, Runtime

WORKER_CLASS = "actorrl.rollout.actor:RolloutWorkerActor"


class Evaluator:
    """The evaluation workers of one trainer. Create with :meth:`create`."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], *, duration: int,
                 unit: str) -> None:
        self.runtime = runtime
        self.workers = workers
        self.duration = duration
        self.unit = unit

    @classmethod
    async def create(cls, driver: DriverLike, env: str, policy: str,
                     worker_config: WorkerConfig, *, num_workers: int, first_index: int,
                     duration: int, unit: str, num_cpus: float) -> Evaluator:
        """Start ``max(1, num_workers)`` evaluation workers (indices from
        ``first_index``, after the training workers)."""
        count = max(1, num_workers)
        workers = await asyncio.gather(*(
            driver.create_actor(
                WORKER_CLASS, args=(env, policy, worker_config),
                kwargs={"worker_index": first_index + i,
                        "num_workers": first_index + count - 1},
                num_cpus=num_cpus, name=f"evaluation-worker-{i + 1}")
            for i in range(count)))
        return cls(driver.runtime, list(workers), duration=duration, unit=unit)

    async def evaluate(self, weights: ObjectRef, filters: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
        """Load ``weights`` (and the driver's observation-filter statistics ``filters``,
        replacing what the evaluation workers gathered themselves) and sample until the
        duration is reached; RLlib's episode stats of the evaluation
        (``episode_reward_mean``... ``episodes_this_iter``, ``timesteps_this_iter``,
        ``custom_metrics``)."""
        get = self.runtime.get_async
        await get([w.set_weights.remote(weights) for w in self.workers], timeout_s=120)
        if filters is not None:
            await get([w.get_filters.remote(True) for w in self.workers], timeout_s=60)
            await get([w.sync_filters.remote(filters) for w in self.workers], timeout_s=60)
        # Episodes that ended before these weights arrived are not this evaluation's.
        await get([w.get_metrics.remote() for w in self.workers], timeout_s=60)
        await get([w.pop_custom_metrics.remote() for w in self.workers], timeout_s=60)
        metrics = EpisodeMetrics()
        custom: list[dict[str, float]] = []
        steps = 0
        while not self._done(metrics, steps):
            counts = await get([w.sample_count.remote() for w in self.workers],
                               timeout_s=600)
            steps += sum(counts)
            for part in await get([w.get_metrics.remote() for w in self.workers],
                                  timeout_s=60):
                metrics = EpisodeMetrics.merge([metrics, part])
            for part in await get([w.pop_custom_metrics.remote() for w in self.workers],
                                  timeout_s=60):
                custom.extend(part)
        return {**metrics.summary(), "timesteps_this_iter": steps,
                "custom_metrics": summarize_custom_metrics(custom)}

    def _done(self, metrics: EpisodeMetrics, steps: int) -> bool:
        if self.unit == "timesteps":
            return steps >= self.duration
        return metrics.num_episodes >= self.duration

    async def stop(self, driver: DriverLike) -> None:
        """Stop the evaluation workers."""
        await asyncio.gather(*(driver.kill_actor(w) for w in self.workers),
                             return_exceptions=True)
