"""IMPALA's dataflow (RLlib's AsyncSamplesOptimizer), read top to bottom.

Every worker keeps ``max_sample_requests_in_flight_per_worker`` samples in flight. A
finished sample stays in its worker; the coordinator keeps only its ref and row count.
Once the refs add up to ``train_batch_size`` rows they go to the learner in one call; the
learner fetches the batches straight from the workers, joins them and queues them for its
learner thread (waiting while its bounded in-queue is full, which is the back-pressure:
while a batch waits, workers that finish are parked instead of sampling on).

The learner's results are long-polled. Weights go back to the workers after every
``broadcast_interval`` train batches, and only when the learner's weights changed: one
``get_weights`` ref at the learner, fetched by each worker before its next sample.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from actorrl.metrics import TimerStat
from actorrl.pipelines.pieces import StepCounters, StepCountersMixin, TaskPool
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectRef, RemoteError, Runtime

log = logging.getLogger(__name__)

ReplaceWorker = Callable[[ActorHandle], Awaitable[ActorHandle | None]]


class AsyncSamplesOptimizer(StepCountersMixin):
    """The IMPALA pipeline over remote rollout workers and a learner actor."""

    def __init__(self, workers: list[ActorHandle], learner: ActorHandle, *,
                 train_batch_size: int, broadcast_interval: int = 1,
                 max_sample_requests_in_flight_per_worker: int = 2,
                 max_learner_requests_in_flight: int = 2,
                 replace_worker: ReplaceWorker | None = None) -> None:
        if not workers:
            raise ValueError("IMPALA needs at least one remote rollout worker (num_workers "
                             ">= 1)")
        if broadcast_interval < 1:
            raise ValueError(f"broadcast_interval must be >= 1, got {broadcast_interval}")
        self.runtime = Runtime.current()
        self.workers = list(workers)
        self.learner = learner
        self.train_batch_size = train_batch_size
        self.broadcast_interval = broadcast_interval
        self.samples_in_flight = max_sample_requests_in_flight_per_worker
        self.max_learner_requests = max_learner_requests_in_flight
        self.replace_worker = replace_worker
        self.counters = StepCounters()
        self.tasks = TaskPool()
        self._kind: dict[ObjectRef, str] = {}
        self.pending: list[tuple[ObjectRef, int]] = []
        self.pending_rows = 0
        self.parked: list[ActorHandle] = []
        self.weights: ObjectRef | None = None
        self.weights_version = -1
        self.worker_versions: dict[ActorHandle, int] = {}
        self.learner_version = 0
        self.batches_since_broadcast = 0
        self.num_weight_broadcasts = 0
        self.num_worker_failures = 0
        self.num_batches_lost = 0
        self.enqueues_in_flight = 0
        self.results_in_flight = False
        self.timers = {k: TimerStat() for k in ("sample_processing", "put_weights", "enqueue")}
        for worker in self.workers:
            for _ in range(self.samples_in_flight):
                self._request_sample(worker)
        self._poll_learner()

    # ---- dispatch ---------------------------------------------------------------------
    def _track(self, actor: ActorHandle, ref: ObjectRef, kind: str) -> None:
        self._kind[ref] = kind
        self.tasks.add(actor, ref)

    def _request_sample(self, worker: ActorHandle) -> None:
        if self.weights is not None and self.worker_versions.get(worker, -1) < self.weights_version:
            with self.timers["put_weights"]:
                # Runs on the worker before the sample below.
                worker.set_weights.remote(self.weights, self.counters.num_steps_sampled)
                self.worker_versions[worker] = self.weights_version
        self._track(worker, worker.sample_ref.remote(), "sample")

    def _poll_learner(self) -> None:
        self._track(self.learner, self.learner.take_results.remote(0.5), "results")
        self.results_in_flight = True

    def _send_train_batches(self) -> None:
        while (self.pending_rows >= self.train_batch_size
               and self.enqueues_in_flight < self.max_learner_requests):
            refs, rows = [], 0
            while rows < self.train_batch_size:
                ref, count = self.pending.pop(0)
                refs.append(ref)
                rows += count
            self.pending_rows -= rows
            self._track(self.learner, self.learner.enqueue_refs.remote(None, refs), "enqueue")
            self.enqueues_in_flight += 1
            self.batches_since_broadcast += 1
        # Room again: parked workers resume sampling.
        while self.parked and self.pending_rows < 2 * self.train_batch_size:
            self._request_sample(self.parked.pop())

    # ---- the step ---------------------------------------------------------------------
    async def step(self, timeout_s: float = 1.0) -> None:
        """Handle everything that finished (waiting up to ``timeout_s`` for the first)."""
        for actor, ref in await self.tasks.completed(timeout_s):
            kind = self._kind.pop(ref, None)
            if kind is None:
                continue  # a call to a worker that failed earlier in this loop
            if kind == "sample":
                await self._on_sample(actor, ref)
            elif kind == "enqueue":
                self.enqueues_in_flight -= 1
                try:
                    await self.runtime.get_async(ref)  # surfaces learner errors
                except RemoteError as exc:
                    if "ObjectLostError" not in exc.type_name:
                        raise
                    # A worker died holding part of this train batch: the batch is lost.
                    self.num_batches_lost += 1
                    log.warning("a train batch was lost with a dead worker: %s", exc.message)
            else:
                self.results_in_flight = False
                self._on_learner_results(await self.runtime.get_async(ref))
                self._poll_learner()
        self._send_train_batches()

    async def _on_sample(self, worker: ActorHandle, ref: ObjectRef) -> None:
        try:
            info = await self.runtime.get_async(ref)
        except ActorDiedError as exc:
            await self._worker_failed(worker, exc)
            return
        with self.timers["sample_processing"]:
            self.pending.append((info["batch"], info["count"]))
            self.pending_rows += info["count"]
            self.counters.num_steps_sampled += info["count"]
        if self.pending_rows >= 2 * self.train_batch_size:
            self.parked.append(worker)
        else:
            self._request_sample(worker)

    def _on_learner_results(self, payload: dict[str, Any]) -> None:
        self.counters.num_steps_trained = payload["num_steps_trained"]
        self.learner_version = payload["weights_version"]
        if (self.learner_version > self.weights_version
                and self.batches_since_broadcast >= self.broadcast_interval):
            self.weights = self.learner.get_weights.remote()
            self.weights_version = self.learner_version
            self.batches_since_broadcast = 0
            self.num_weight_broadcasts += 1

    async def _worker_failed(self, worker: ActorHandle, exc: BaseException) -> None:
        if worker not in self.workers:
            return  # already handled (it had several calls in flight)
        self.num_worker_failures += 1
        log.warning("rollout worker %r failed: %s", worker, exc)
        self.tasks.remove_actor(worker)
        # Its samples not yet sent to the learner died with it (they live in the worker).
        self.pending = [(ref, n) for ref, n in self.pending if ref.owner != worker.endpoint]
        self.pending_rows = sum(n for _, n in self.pending)
        self._kind = {ref: kind for ref, kind in self._kind.items()
                      if ref.owner != worker.endpoint}
        if worker in self.parked:
            self.parked.remove(worker)
        self.worker_versions.pop(worker, None)
        if worker in self.workers:
            self.workers.remove(worker)
        if self.replace_worker is None:
            return
        new = await self.replace_worker(worker)
        if new is not None:
            self.workers.append(new)
            for _ in range(self.samples_in_flight):
                self._request_sample(new)

    # ---- the PolicyOptimizer surface --------------------------------------------------
    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set: tasks of removed workers are forgotten, new ones start."""
        self.tasks.reset_workers([*workers, self.learner])
        self.parked = [w for w in self.parked if w in workers]
        added = [w for w in workers if w not in self.workers]
        self.workers = list(workers)
        for worker in added:
            for _ in range(self.samples_in_flight):
                self._request_sample(worker)

    async def stats(self) -> dict[str, Any]:
        """RLlib's AsyncSamplesOptimizer stats plus the learner's."""
        learner = await self.runtime.get_async(self.learner.stats.remote(), timeout_s=60)
        timing = {f"{k}_time_ms": round(1000 * t.mean, 3) for k, t in self.timers.items()}
        timing.update(learner["timing_breakdown"])
        return {
            **self.counters.stats(),
            "num_weight_broadcasts": self.num_weight_broadcasts,
            "num_worker_failures": self.num_worker_failures,
            "num_batches_lost": self.num_batches_lost,
            "learner_queue": learner["learner_queue"],
            "learner": learner["learner"],
            "timing_breakdown": timing,
            "pending_sample_rows": self.pending_rows,
            "parked_workers": len(self.parked),
            "learner_device": learner["device"],
            "num_towers": learner["num_towers"],
        }

    async def stop(self) -> None:
        """Stop the learner thread (actors are stopped by their owner)."""
        try:
            await self.runtime.get_async(self.learner.stop.remote(), timeout_s=10)
        except (ActorDiedError, TimeoutError) as exc:
            log.debug("learner stop: %s", exc)
