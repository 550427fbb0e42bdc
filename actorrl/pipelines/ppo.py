"""Synchronous sampling and minibatch SGD (RLlib's PPO ``training_step``: synchronous
parallel sampling, advantage standardisation, multi-GPU minibatch SGD), top to bottom.

One step: broadcast the learner's weights once (one ref, many ``set_weights``), so every
sample of the step comes from the current policy; sample from every worker in parallel,
round after round, until at least ``train_batch_size`` env steps are in hand (each worker
postprocesses its fragments with GAE: ``advantages``, ``value_targets``); then the learner
fetches those samples straight from the workers and runs the epochs of minibatch SGD
(:meth:`actorrl.learner.actor.LearnerActor.learn_on_train_batch`), adapting each policy's
KL coefficient at the end. With no remote workers (``num_workers: 0``) the learner's own
local worker samples and no weights need broadcasting.

A rollout worker that dies is counted and replaced in its slot (the trainer's
``replace_worker`` starts a new one with the learner's weights); the samples the others
returned in that round are kept, and the replacement samples from the next round on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actorrl.messages import SampleReply
from actorrl.metrics import TimerStat
from actorrl.pipelines.pieces import Fleet, ReplaceWorker, StepCounters, StepCountersMixin
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectRef, Runtime

CALL_TIMEOUT_S = 600.0
"""Longest wait for one round of samples or one learner step."""


class SyncSamplesOptimizer(StepCountersMixin):
    """The synchronous PPO pipeline over remote workers (or the learner's local worker,
    ``sample_locally``) and a learner actor."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                 *, train_batch_size: int, sample_locally: bool = False,
                 replace_worker: ReplaceWorker | None = None) -> None:
        if train_batch_size < 1:
            raise ValueError(f"train_batch_size must be >= 1, got {train_batch_size}")
        if not workers and not sample_locally:
            raise ValueError("the PPO pipeline needs remote workers or sample_locally=True "
                             "(the learner's local worker samples)")
        self.runtime = runtime
        self.worker_fleet = Fleet(workers, replace_worker, "rollout worker")
        self.learner = learner
        self.sample_locally = sample_locally
        self.train_batch_size = train_batch_size
        self.counters = StepCounters()
        self.update_weights_timer = TimerStat()
        self.sample_timer = TimerStat()
        self.learn_timer = TimerStat()
        self.learner_stats: dict[str, Any] = {}
        self.fetch_time_s = 0.0

    async def step(self) -> dict[str, Any]:
        """Sample at least ``train_batch_size`` env steps with the current weights and
        learn on them; returns the learner stats."""
        with self.update_weights_timer:
            if self.workers:
                weights = self.learner.get_weights.remote()
                await self._on_each_worker(lambda w: w.set_weights.remote(weights))
        refs: list[ObjectRef] = []
        rows = 0
        with self.sample_timer:
            while rows < self.train_batch_size:
                if self.workers:
                    replies: list[SampleReply] = await self._on_each_worker(
                        lambda w: w.sample_ref.remote())
                else:
                    replies = [await self.runtime.get_async(self.learner.sample_ref.remote(),
                                                            timeout_s=CALL_TIMEOUT_S)]
                refs += [reply.batch for reply in replies]
                rows += sum(reply.count for reply in replies)
            self.sample_timer.push_units_processed(rows)
        with self.learn_timer:
            result = await self.runtime.get_async(
                self.learner.learn_on_train_batch_refs.remote(refs), timeout_s=CALL_TIMEOUT_S)
            self.learn_timer.push_units_processed(result["count"])
        self.fetch_time_s = float(result.get("fetch_time_s", 0.0))
        stats = result["learner_stats"]
        self.learner_stats = (stats.get("default_policy", stats) if len(stats) == 1
                              else stats)
        self.counters.num_steps_sampled += rows
        self.counters.num_steps_trained += result["count"]
        return self.learner_stats

    async def _on_each_worker(self, call: Any) -> list[Any]:
        """``call(worker)`` on every live worker at once; the results of those that
        answered. A worker that died is replaced (see the module docstring); with no
        worker left and none to replace it, the step fails naming the error."""
        workers = list(self.workers)
        results = await asyncio.gather(
            *(self.runtime.get_async(call(w), timeout_s=CALL_TIMEOUT_S) for w in workers),
            return_exceptions=True)
        answered = []
        for worker, result in zip(workers, results):
            if isinstance(result, ActorDiedError):
                await self.worker_fleet.failed(worker, result, lambda _w: None)
            elif isinstance(result, BaseException):
                raise result
            else:
                answered.append(result)
        if not self.workers:
            raise RuntimeError("every rollout worker died and none could be replaced; "
                               "see the log for why the replacements failed")
        return answered

    @property
    def workers(self) -> list[ActorHandle]:
        """The live rollout workers."""
        return self.worker_fleet.actors

    @property
    def num_worker_failures(self) -> int:
        """Rollout workers that died."""
        return self.worker_fleet.num_failures

    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set (takes effect at the next step)."""
        self.worker_fleet.actors = list(workers)

    async def stats(self) -> dict[str, Any]:
        """Counters, timings (ms) and throughputs, and the last step's learner stats."""
        return {
            **self.counters.stats(),
            "num_worker_failures": self.num_worker_failures,
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
