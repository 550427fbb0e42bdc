"""Synchronous microbatch training (RLlib's MicrobatchOptimizer), read top to bottom.

One step: broadcast the learner's weights once (one ref, many ``set_weights``); then,
microbatch after microbatch, sample from every worker in parallel until at least
``microbatch_size`` env steps are in hand, and have the learner fetch those samples from
the workers and add their gradients (per trainable policy, weighted by row count) to its
accumulator; once ``train_batch_size`` steps are covered, the learner applies the
count-weighted mean once. Because each microbatch gradient is the gradient of a mean loss,
``sum(count_i * grad_i) / sum(count_i)`` is exactly the full-batch gradient. With no remote
workers (``num_workers: 0``) the learner's own local worker samples (RLlib's local worker),
and no weights need broadcasting.
"""

from __future__ import annotations

from typing import Any

from actorrl.messages import SampleReply
from actorrl.metrics import TimerStat
from actorrl.pipelines.pieces import StepCounters, StepCountersMixin
from actorrl.runtime import ActorHandle, Runtime


class MicrobatchOptimizer(StepCountersMixin):
    """The microbatch pipeline over remote workers and a learner actor."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                 *, train_batch_size: int, microbatch_size: int,
                 sample_locally: bool = False) -> None:
        if train_batch_size <= microbatch_size:
            raise ValueError(f"The microbatch size must be smaller than the train batch "
                             f"size, got microbatch_size={microbatch_size} vs "
                             f"train_batch_size={train_batch_size}")
        if not workers and not sample_locally:
            raise ValueError("the microbatch optimizer needs remote workers or "
                             "sample_locally=True (the learner's local worker samples)")
        self.sample_locally = sample_locally
        self.runtime = runtime
        self.workers = list(workers)
        self.learner = learner
        self.train_batch_size = train_batch_size
        self.microbatch_size = microbatch_size
        self.counters = StepCounters()
        self.update_weights_timer = TimerStat()
        self.sample_timer = TimerStat()
        self.grad_timer = TimerStat()
        self.learner_stats: dict[str, Any] = {}

    async def step(self) -> dict[str, Any]:
        """One accumulated update over ``train_batch_size`` env steps."""
        with self.update_weights_timer:
            weights = self.learner.get_weights.remote()
            for worker in self.workers:
                worker.set_weights.remote(weights)
        samplers = self.workers or ([self.learner] if self.sample_locally else [])
        samples_so_far = 0
        while samples_so_far < self.train_batch_size:
            with self.sample_timer:
                refs, rows = [], 0
                while rows < self.microbatch_size:
                    replies: list[SampleReply] = await self.runtime.get_async(
                        [w.sample_ref.remote() for w in samplers], timeout_s=600)
                    refs += [r.batch for r in replies]
                    rows += sum(r.count for r in replies)
                self.sample_timer.push_units_processed(rows)
            with self.grad_timer:
                result = await self.runtime.get_async(
                    self.learner.accumulate_gradients_refs.remote(refs), timeout_s=600)
                self.grad_timer.push_units_processed(result["count"])
            stats = result["learner_stats"]
            self.learner_stats = stats.get("default_policy", stats) if len(stats) == 1 else stats
            samples_so_far += rows
        await self.runtime.get_async(self.learner.apply_accumulated_gradients.remote(),
                                     timeout_s=600)
        self.counters.num_steps_sampled += samples_so_far
        self.counters.num_steps_trained += samples_so_far
        return self.learner_stats

    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set (takes effect at the next step)."""
        self.workers = list(workers)

    async def stats(self) -> dict[str, Any]:
        """RLlib's MicrobatchOptimizer stats."""
        return {
            **self.counters.stats(),
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
