"""Synchronous microbatch training (RLlib's MicrobatchOptimizer), read top to bottom.

One step: broadcast the learner's weights once (one ref, many ``set_weights``); then,
microbatch after microbatch, sample from every worker in parallel until at least
``microbatch_size`` env steps are in hand, and have the learner fetch those samples from
the workers and add their gradients (per trainable policy, weighted by row count) to its
accumulator; once ``train_batch_size`` steps are covered, the learner applies the
count-weighted mean once. Because each microbatch gradient is the gradient of a mean loss,
``sum(count_i * grad_i) / sum(count_i)`` is exactly the full-batch gradient. The broadcast
carries the run's env-step count (``global_timestep``, restored steps included) for the
workers' schedules. With no remote workers (``num_workers: 0``) the learner's own local
worker samples (RLlib's local worker), and no weights need broadcasting.

A rollout worker that dies is counted and replaced in its slot (the trainer's
``replace_worker`` starts a new one with the learner's weights), as in the PPO pipeline:
the samples the others returned in that round are kept, and the replacement samples from
the next round on.
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


class MicrobatchOptimizer(SyncFleetMixin):
    """The microbatch pipeline over remote workers and a learner actor."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                 *, train_batch_size: int, microbatch_size: int,
                 sample_locally: bool = False,
                 replace_worker: ReplaceWorker | None = None) -> None:
        if train_batch_size < microbatch_size:
            raise ValueError(f"The microbatch size must be at most the train batch size, "
                             f"got microbatch_size={microbatch_size} vs "
                             f"train_batch_size={train_batch_size}")
        self._attach_sync(runtime, workers, learner, replace_worker,
                          sample_locally=sample_locally,
                          no_workers="the microbatch optimizer needs remote workers or "
                                     "sample_locally=True (the learner's local worker samples)")
        self.train_batch_size = train_batch_size
        self.microbatch_size = microbatch_size
        self.grad_timer = TimerStat()

    async def step(self) -> dict[str, Any]:
        """One accumulated update over ``train_batch_size`` env steps."""
        with self.update_weights_timer:
            if self.workers:
                await self._broadcast_weights()
        samples_so_far = 0
        while samples_so_far < self.train_batch_size:
            # A sample lost before the learner's fetch is sampled again.
            result, rows = await self._learn_on_samples(
                self.learner.accumulate_gradients_refs.remote, self.microbatch_size,
                self.grad_timer)
            self.grad_timer.push_units_processed(result["count"])
            stats = result["learner_stats"]
            self.learner_stats = stats.get("default_policy", stats) if len(stats) == 1 else stats
            samples_so_far += rows
        await self.runtime.get_async(self.learner.apply_accumulated_gradients.remote(),
                                     timeout_s=SYNC_CALL_TIMEOUT_S)
        self.counters.num_steps_sampled += samples_so_far
        self.counters.num_steps_trained += samples_so_far
        return self.learner_stats

    async def stats(self) -> dict[str, Any]:
        """RLlib's MicrobatchOptimizer stats."""
        return {
            **self.counters.stats(),
            "num_worker_failures": self.num_worker_failures,
            "num_samples_dropped": self.num_samples_dropped,
            "sample_time_ms": round(1000 * self.sample_timer.mean, 3),
            "grad_time_ms": round(1000 * self.grad_timer.mean, 3),
            "update_time_ms": round(1000 * self.update_weights_timer.mean, 3),
            "opt_peak_throughput": round(self.grad_timer.mean_throughput, 3),
            "sample_peak_throughput": round(self.sample_timer.mean_throughput, 3),
            "opt_samples": round(self.grad_timer.mean_units_processed, 3),
            "learner": self.learner_stats,
        }

    async def stop(self) -> None:
        """Nothing runs between steps."""
