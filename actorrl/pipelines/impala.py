"""IMPALA's dataflow (RLlib's AsyncSamplesOptimizer), read top to bottom.

Every worker keeps ``max_sample_requests_in_flight_per_worker`` samples in flight. A
finished sample stays in its worker; the coordinator keeps only its ref and row count.
Once the refs add up to ``train_batch_size`` rows they go to the learner in one call (at
most ``max_learner_requests_in_flight`` such calls: a credit window); the learner fetches
the batches straight from the workers, joins them and queues them for its learner thread
(waiting while its bounded in-queue is full). That is the back-pressure: while rows for
two train batches wait, the pacer parks workers whose samples come back.

The learner pushes a notice each time it trained (one ``wait_trained`` call kept
outstanding). Weights go back to the workers after every ``broadcast_interval`` train
batches, and only when the learner's weights changed: one ``get_weights`` ref at the
learner, fetched by each worker before its next sample.
"""

from __future__ import annotations

import logging
from typing import Any

from actorrl.messages import SampleReply, TrainedNotice
from actorrl.pipelines.pieces import (
    CreditWindow,
    FleetPipelineMixin,
    ReplaceWorker,
    SamplingPacer,
    TaskPool,
    require_at_least_one,
)
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectLostError, ObjectRef, Runtime
from actorrl.util.failures import failure_line
from actorrl.util.stats import TimerStat

log = logging.getLogger(__name__)

TRAINED_WAIT_S = 30.0


class AsyncSamplesOptimizer(FleetPipelineMixin):
    """The IMPALA pipeline over remote rollout workers and a learner actor."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle], learner: ActorHandle,
                 *, train_batch_size: int, broadcast_interval: int,
                 max_sample_requests_in_flight_per_worker: int,
                 max_learner_requests_in_flight: int = 2,
                 replace_worker: ReplaceWorker | None = None) -> None:
        self._attach(runtime, workers, learner, replace_worker,
                     no_workers="IMPALA needs at least one remote rollout worker "
                                "(num_workers >= 1)")
        require_at_least_one("broadcast_interval", broadcast_interval)
        self.train_batch_size = train_batch_size
        self.broadcast_interval = broadcast_interval
        self.samples_in_flight = max_sample_requests_in_flight_per_worker
        self.enqueue_credits = CreditWindow(max_learner_requests_in_flight)
        self.tasks = TaskPool(runtime)
        self.pending: list[tuple[ObjectRef, int]] = []
        self.pending_rows = 0
        self.pacer = SamplingPacer(
            lambda extra: self.pending_rows + extra >= 2 * self.train_batch_size)
        self.weights: ObjectRef | None = None
        self.weights_version = -1
        self.worker_versions: dict[ActorHandle, int] = {}
        self.learner_version = 0
        self.batches_since_broadcast = 0
        self.num_weight_broadcasts = 0
        self.num_batches_lost = 0
        self.timers = {k: TimerStat() for k in ("sample_processing", "put_weights", "enqueue")}
        self._start_sampling(workers)
        self.tasks.add(learner, learner.wait_trained.remote(TRAINED_WAIT_S))

    # ---- dispatch ---------------------------------------------------------------------
    def _start_sampling(self, workers: list[ActorHandle]) -> None:
        for worker in workers:
            for _ in range(self.samples_in_flight):
                self._request_sample(worker)

    def _request_sample(self, worker: ActorHandle) -> None:
        if self.weights is not None and self.worker_versions.get(worker, -1) < self.weights_version:
            with self.timers["put_weights"]:
                # Runs on the worker before the sample below.
                worker.set_weights.remote(self.weights, self.counters.global_timestep)
                self.worker_versions[worker] = self.weights_version
        self.tasks.add(worker, worker.sample_ref.remote())

    def _send_train_batches(self) -> None:
        while self.pending_rows >= self.train_batch_size and self.enqueue_credits.take():
            refs, rows = [], 0
            while rows < self.train_batch_size:
                ref, count = self.pending.pop(0)
                refs.append(ref)
                rows += count
            self.pending_rows -= rows
            self.tasks.add(self.learner, self.learner.enqueue_refs.remote(None, refs))
            self.batches_since_broadcast += 1
        # Room again: parked workers resume sampling.
        for worker in self.pacer.release():
            self._request_sample(worker)

    # ---- the step ---------------------------------------------------------------------
    async def step(self, timeout_s: float = 1.0) -> None:
        """Handle everything that finished (waiting up to ``timeout_s`` for the first)."""
        died: list[tuple[ActorHandle, BaseException]] = []
        for actor, ref in await self.tasks.completed(timeout_s):
            if actor == self.learner:
                await self._on_learner_reply(ref)
            elif actor in self.worker_fleet:  # else it was replaced already
                error = await self._on_sample(actor, ref)
                if error is not None:
                    died.append((actor, error))
        self.worker_fleet.check()
        died += self.pacer.dead(self.runtime)
        if died:
            await self._tell_learner(died)
            # All at once and in the background: the workers of a lost node are replaced
            # concurrently while the survivors go on sampling (one after another, a node
            # of 64 workers stalled the pipeline for 64 start times; waited for, it
            # stalled until there was room for them).
            self.worker_fleet.replace_in_background(died, self._forget_worker,
                                                    self._start_sampling)
        self._send_train_batches()

    async def _tell_learner(self, died: list[tuple[ActorHandle, BaseException]]) -> None:
        """The learner may be fetching train batches from the dead workers: its fetches
        fail at once instead of waiting out the connect timeout (30 s) while holding
        enqueue credit (a lost node of 64 workers stalled IMPALA for that long)."""
        endpoints = sorted({worker.endpoint for worker, _ in died})
        try:
            await self.runtime.get_async(
                self.learner.owners_died.remote(endpoints, "its rollout worker died"),
                timeout_s=10)
        except (ActorDiedError, TimeoutError) as exc:  # the step surfaces a dead learner
            log.warning("could not tell the learner about dead workers: %s",
                        failure_line(exc))

    async def _on_sample(self, worker: ActorHandle, ref: ObjectRef
                         ) -> ActorDiedError | None:
        """Route one sample reply; the error when its worker died (replaced by the
        caller)."""
        try:
            reply: SampleReply = await self.runtime.get_async(ref)
        except ActorDiedError as exc:
            return exc
        with self.timers["sample_processing"]:
            self.pending.append((reply.batch, reply.count))
            self.pending_rows += reply.count
            self.counters.num_steps_sampled += reply.count
        if self.pacer.admit(worker):
            self._request_sample(worker)
        return None

    async def _on_learner_reply(self, ref: ObjectRef) -> None:
        try:
            reply = await self.runtime.get_async(ref)  # surfaces learner errors
        except ObjectLostError as exc:
            # A worker died holding part of this train batch: the batch is lost.
            self.enqueue_credits.give_back()
            self.num_batches_lost += 1  # in the stats; the worker's failure is logged
            log.debug("a train batch was lost with a dead worker: %s", exc)
            return
        if isinstance(reply, TrainedNotice):
            self._on_trained(reply)
            self.tasks.add(self.learner, self.learner.wait_trained.remote(TRAINED_WAIT_S))
        else:  # an EnqueueReply: the learner queued the batch
            self.enqueue_credits.give_back()

    def _on_trained(self, notice: TrainedNotice) -> None:
        self.counters.num_steps_trained = notice.num_steps_trained
        self.learner_version = notice.weights_version
        if (self.learner_version > self.weights_version
                and self.batches_since_broadcast >= self.broadcast_interval):
            self.weights = self.learner.get_weights.remote()
            self.weights_version = self.learner_version
            self.batches_since_broadcast = 0
            self.num_weight_broadcasts += 1

    def _forget_worker(self, worker: ActorHandle) -> None:
        self.tasks.remove_actor(worker)
        # Its samples not yet sent to the learner died with it (they live in the worker).
        self.pending = [(ref, n) for ref, n in self.pending if ref.owner != worker.endpoint]
        self.pending_rows = sum(n for _, n in self.pending)
        self.pacer.keep(w for w in self.workers if w != worker)
        self.worker_versions.pop(worker, None)

    # ---- the PolicyOptimizer surface --------------------------------------------------
    @property
    def parked(self) -> list[ActorHandle]:
        """Workers waiting for the learner to take the pending rows."""
        return self.pacer.parked

    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set: tasks of removed workers are forgotten, new ones start."""
        self.tasks.reset_workers([*workers, self.learner])
        self.pacer.keep(workers)
        added = [w for w in workers if w not in self.workers]
        self.worker_fleet.actors = list(workers)
        self._start_sampling(added)

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
            "parked_workers": len(self.pacer.parked),
            "learner_device": learner["device"],
            "num_towers": learner["num_towers"],
        }
