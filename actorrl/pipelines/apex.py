"""Ape-X's dataflow (RLlib's AsyncReplayOptimizer), read top to bottom.

Actors: rollout workers, ``num_replay_buffer_shards`` replay shards, one learner process.
In flight at all times: 2 ``sample`` calls per worker (SAMPLE_QUEUE_DEPTH) and 4 ``replay``
calls per shard (REPLAY_QUEUE_DEPTH), plus one long-poll of the learner's results.

Each step handles whatever finished:

1. A finished sample goes from its worker straight to a random shard (the coordinator
   passes the ref). The worker's step counter grows; past ``max_weight_sync_delay`` it gets
   the learner's weights (a fresh ``get_weights`` only if the learner has updated since the
   last one). Then it samples again. A failed worker is reported and replaced; the other
   finished samples of the step are still used. A dead replay shard is replaced by an
   empty one at the same index (its data is lost, and counted in ``num_shard_failures``).
2. A finished replay goes to the learner's bounded in-queue; when the queue is full it is
   dropped without being fetched, and counted (``num_samples_dropped``). The coordinator
   tracks the queue from the learner's replies, so most drops cost no call to the learner;
   the learner refuses (and the coordinator counts) the rare one that finds it full.
   The shard replays again at once, unless its replay was just dropped: then it is asked
   again when the learner has room (4 replays stay in flight per shard while the learner
   keeps up, and the coordinator and shard do not spin on drops while it does not).
With ``training_intensity`` (RLlib's later key; None in the original Ape-X), a worker whose
sample comes back while the learner has trained on fewer than ``training_intensity`` rows
per sampled env step is parked until the learner catches up: on a small machine the
samplers would otherwise take the CPU the learner needs. After a shard is replaced,
sampling runs unpaced for another ``learning_starts`` steps while the new shard refills.

3. Learner results carry ``td_error`` per row; ``|td_error| + eps`` go back, as new
   priorities, to the shard the batch came from.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from actorrl.metrics import TimerStat
from actorrl.pipelines.impala import ReplaceWorker
from actorrl.pipelines.pieces import StepCounters, StepCountersMixin, TaskPool, Wakeup
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectRef, RemoteError, Runtime

log = logging.getLogger(__name__)

SAMPLE_QUEUE_DEPTH = 2
REPLAY_QUEUE_DEPTH = 4


class AsyncReplayOptimizer(StepCountersMixin):
    """The Ape-X pipeline over remote workers, replay shard actors and a learner actor."""

    def __init__(self, workers: list[ActorHandle], replay_actors: list[ActorHandle],
                 learner: ActorHandle, *, learner_queue_size: int = 16,
                 max_weight_sync_delay: int = 400, training_intensity: float | None = None,
                 learning_starts: int = 0, replace_shard: ReplaceWorker | None = None,
                 debug: bool = False, replace_worker: ReplaceWorker | None = None,
                 seed: int | None = None) -> None:
        if not workers:
            raise ValueError("Ape-X needs at least one remote rollout worker (num_workers "
                             ">= 1)")
        if not replay_actors:
            raise ValueError("Ape-X needs at least one replay shard")
        self.runtime = Runtime.current()
        self.workers = list(workers)
        self.replay_actors = list(replay_actors)
        self.learner = learner
        self.max_weight_sync_delay = max_weight_sync_delay
        self.learner_queue_size = learner_queue_size
        self.training_intensity = training_intensity
        self.learning_starts = learning_starts
        # Pacing counts from here: moved to "now" when a replaced shard must refill, so
        # sampling runs free for another learning_starts steps (else the learner, short of
        # replayable data, and the parked samplers would wait on each other forever).
        self._pacing_sampled = 0
        self._pacing_trained = 0
        self.parked: list[ActorHandle] = []
        self.deferred_replays: list[ActorHandle] = []
        # Replays accepted by the learner and not yet reported trained: the coordinator's
        # view of the learner's in-queue (plus the batch in training), so a full queue is
        # seen here and the replay dropped without a round trip to the learner.
        self.learner_backlog = 0
        # Set when the learner refused a replay (its queue was full), until it reports
        # trained batches again: no replay is requested or sent meanwhile.
        self.learner_full = False
        self.debug = debug
        self.replace_worker = replace_worker
        self.replace_shard = replace_shard
        self.num_shard_failures = 0
        # Replays are tagged with an id their shard keeps for life (a replacement gets a new
        # one), so priorities computed after a shard died never reach another shard.
        self._shards_by_id = dict(enumerate(self.replay_actors))
        self._next_shard_id = len(self.replay_actors)
        self._random = random.Random(seed)
        self.counters = StepCounters()
        self.timers = {k: TimerStat() for k in (
            "put_weights", "get_samples", "sample_processing", "replay_processing",
            "update_priorities", "train", "sample")}
        self.num_weight_syncs = 0
        self.num_samples_dropped = 0
        self.num_worker_failures = 0
        self.learning_started = False
        self.steps_since_update: dict[ActorHandle, int] = {}
        self.weights: ObjectRef | None = None
        self.weights_version = -1
        self.learner_version = 0
        self.learner_stats: dict[str, Any] = {}
        self._wakeup = Wakeup()
        self.sample_tasks = TaskPool(self._wakeup)
        self.replay_tasks = TaskPool(self._wakeup)
        self.learner_tasks = TaskPool(self._wakeup)
        for shard in self.replay_actors:
            for _ in range(REPLAY_QUEUE_DEPTH):
                self.replay_tasks.add(shard, shard.replay.remote())
        self._set_workers(self.workers)
        self._poll_learner()

    def _set_workers(self, workers: list[ActorHandle]) -> None:
        for worker in workers:
            self.steps_since_update[worker] = 0
            for _ in range(SAMPLE_QUEUE_DEPTH):
                self.sample_tasks.add(worker, worker.sample_ref.remote())

    def _poll_learner(self) -> None:
        self.learner_tasks.add(self.learner, self.learner.take_results.remote(0.5))

    # ---- the step ---------------------------------------------------------------------
    async def step(self, timeout_s: float = 1.0) -> None:
        """One pass over everything that finished (waiting up to ``timeout_s`` for it)."""
        await self._wakeup.wait(timeout_s)
        start = time.perf_counter()
        sample_steps = await self._process_samples()
        # Counted before replays are handled: a shard replaced there starts its pacing
        # after this step's samples (which went to the dead shard).
        self.counters.num_steps_sampled += sample_steps
        await self._process_replays()
        train_steps = await self._process_learner_results()
        elapsed = time.perf_counter() - start
        self.timers["sample"].push(elapsed)
        self.timers["sample"].push_units_processed(sample_steps)
        if train_steps > 0:
            self.learning_started = True
        if self.learning_started:
            self.timers["train"].push(elapsed)
            self.timers["train"].push_units_processed(train_steps)
        self.counters.num_steps_trained += train_steps
        self._resume_parked()

    def _sampling_ahead(self, extra_sampled: int = 0) -> bool:
        """With ``training_intensity``, sampling waits while the learner has trained on
        fewer than ``training_intensity`` rows per env step sampled since learning_starts."""
        if self.training_intensity is None:
            return False
        sampled = (self.counters.num_steps_sampled + extra_sampled - self._pacing_sampled
                   - self.learning_starts)
        trained = self.counters.num_steps_trained - self._pacing_trained
        return trained < self.training_intensity * sampled

    def _resume_parked(self) -> None:
        while self.parked and not self._sampling_ahead():
            worker = self.parked.pop(0)
            self.sample_tasks.add(worker, worker.sample_ref.remote())
        while (self.deferred_replays and not self.learner_full
               and self.learner_backlog <= self.learner_queue_size):
            shard = self.deferred_replays.pop(0)
            self.replay_tasks.add(shard, shard.replay.remote())

    async def _process_samples(self) -> int:
        sample_steps = 0
        with self.timers["sample_processing"]:
            completed = await self.sample_tasks.completed(0)
            failures: list[tuple[ActorHandle, BaseException]] = []
            for worker, ref in completed:
                try:
                    info = await self.runtime.get_async(ref)
                except ActorDiedError as exc:
                    failures.append((worker, exc))
                    continue
                count = info["count"]
                sample_steps += count
                shard = self._random.choice(self.replay_actors)
                shard.add_batch.remote([info["batch"]])
                self.steps_since_update[worker] = self.steps_since_update.get(worker, 0) + count
                if self.steps_since_update[worker] >= self.max_weight_sync_delay:
                    self._sync_weights(worker)
                if self._sampling_ahead(sample_steps):
                    self.parked.append(worker)
                else:
                    self.sample_tasks.add(worker, worker.sample_ref.remote())
        for worker, exc in failures:
            await self._worker_failed(worker, exc)
        return sample_steps

    def _sync_weights(self, worker: ActorHandle) -> None:
        # Pull new weights only when the learner has updated since the last pull.
        if self.weights is None or self.learner_version > self.weights_version:
            with self.timers["put_weights"]:
                self.weights = self.learner.get_weights.remote()
                self.weights_version = self.learner_version
        worker.set_weights.remote(self.weights, self.counters.num_steps_sampled)
        self.num_weight_syncs += 1
        self.steps_since_update[worker] = 0

    async def _process_replays(self) -> None:
        with self.timers["replay_processing"]:
            for shard, ref in await self.replay_tasks.completed(0):
                if isinstance(self.runtime.call_error(ref), ActorDiedError):
                    await self._shard_failed(shard)
                    continue
                if self.learner_full or self.learner_backlog > self.learner_queue_size:
                    self.num_samples_dropped += 1
                    self.runtime.free(ref)
                    # Ask again once the learner has room, rather than spin on drops.
                    self.deferred_replays.append(shard)
                    continue
                self.replay_tasks.add(shard, shard.replay.remote())
                tag = self._shard_id(shard)
                self.learner_backlog += 1
                self.learner_tasks.add(
                    self.learner, self.learner.enqueue_refs.remote(tag, [ref], False))

    async def _process_learner_results(self) -> int:
        train_steps = 0
        with self.timers["update_priorities"]:
            for _, ref in await self.learner_tasks.completed(0):
                try:
                    reply = await self.runtime.get_async(ref)
                except RemoteError as exc:
                    if "ObjectLostError" not in exc.type_name:
                        raise
                    # The replay's shard died before the learner fetched it: a lost batch.
                    self.learner_backlog -= 1
                    continue
                if "results" not in reply:  # an enqueue reply
                    if not reply["queued"]:
                        self.learner_backlog -= 1
                    if reply["dropped"]:
                        self.num_samples_dropped += 1
                        self.learner_full = True
                    continue
                self.learner_version = reply["weights_version"]
                if reply["results"]:
                    self.learner_full = False
                for result in reply["results"]:
                    self.learner_backlog -= 1
                    train_steps += result["env_steps"]
                    shard = self._shards_by_id.get(result["tag"])
                    prio_dict = {
                        pid: (rows["batch_indexes"], rows["td_error"])
                        for pid, rows in result["per_sample"].items()
                        if "batch_indexes" in rows and "td_error" in rows
                    }
                    if prio_dict and shard is not None:
                        shard.update_priorities.remote(prio_dict)
                self._poll_learner()
        return train_steps

    def _shard_id(self, shard: ActorHandle) -> int:
        return next((i for i, s in self._shards_by_id.items() if s == shard), -1)

    async def _shard_failed(self, shard: ActorHandle) -> None:
        """A replay shard died: its replay data is lost (reported); a fresh, empty shard
        takes its index and sampling and training go on."""
        if shard not in self.replay_actors:
            return  # already handled (it had several replays in flight)
        index = self.replay_actors.index(shard)
        self.num_shard_failures += 1
        del self._shards_by_id[self._shard_id(shard)]
        self.replay_tasks.remove_actor(shard)
        self.deferred_replays = [s for s in self.deferred_replays if s != shard]
        log.warning("replay shard %d (%r) died: its replay data is lost; it refills from "
                    "new samples", index, shard)
        new = await self.replace_shard(shard) if self.replace_shard is not None else None
        if new is None:
            self.replay_actors.pop(index)
            if not self.replay_actors:
                raise RuntimeError("every replay shard died and none could be replaced")
            return
        self.replay_actors[index] = new
        new_id = self._next_shard_id
        self._next_shard_id += 1
        self._shards_by_id[new_id] = new
        self._pacing_sampled = self.counters.num_steps_sampled
        self._pacing_trained = self.counters.num_steps_trained
        for _ in range(REPLAY_QUEUE_DEPTH):
            self.replay_tasks.add(new, new.replay.remote())

    async def _worker_failed(self, worker: ActorHandle, exc: BaseException) -> None:
        if worker not in self.workers:
            return  # already handled (it had several calls in flight)
        self.num_worker_failures += 1
        log.warning("rollout worker %r failed: %s", worker, exc)
        self.sample_tasks.remove_actor(worker)
        self.steps_since_update.pop(worker, None)
        if worker in self.parked:
            self.parked.remove(worker)
        if worker in self.workers:
            self.workers.remove(worker)
        if self.replace_worker is None:
            return
        new = await self.replace_worker(worker)
        if new is not None:
            self.workers.append(new)
            self._set_workers([new])

    # ---- the PolicyOptimizer surface --------------------------------------------------
    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set."""
        self.sample_tasks.reset_workers(workers)
        self.parked = [w for w in self.parked if w in workers]
        added = [w for w in workers if w not in self.workers]
        self.workers = list(workers)
        self.steps_since_update = {w: self.steps_since_update.get(w, 0) for w in workers}
        self._set_workers(added)

    async def stats(self) -> dict[str, Any]:
        """RLlib's AsyncReplayOptimizer stats (timing and pending counts with ``debug``)."""
        learner = await self.runtime.get_async(self.learner.stats.remote(), timeout_s=60)
        try:
            replay_stats = await self.runtime.get_async(
                self.replay_actors[0].stats.remote(self.debug), timeout_s=60)
        except ActorDiedError as exc:  # replaced at the next step
            replay_stats = {"error": str(exc)}
        timing = {f"{k}_time_ms": round(1000 * t.mean, 3) for k, t in self.timers.items()}
        timing["learner_grad_time_ms"] = learner["timing_breakdown"]["learner_grad_time_ms"]
        timing["learner_dequeue_time_ms"] = learner["timing_breakdown"][
            "learner_dequeue_time_ms"]
        stats: dict[str, Any] = {
            **self.counters.stats(),
            "sample_throughput": round(self.timers["sample"].mean_throughput, 3),
            "train_throughput": round(self.timers["train"].mean_throughput, 3),
            "num_weight_syncs": self.num_weight_syncs,
            "num_samples_dropped": self.num_samples_dropped,
            "num_worker_failures": self.num_worker_failures,
            "num_shard_failures": self.num_shard_failures,
            "parked_sample_requests": len(self.parked),
            "learner_queue": learner["learner_queue"],
            "replay_shard_0": replay_stats,
        }
        if self.debug:
            stats.update({
                "timing_breakdown": timing,
                "pending_sample_tasks": self.sample_tasks.count,
                "pending_replay_tasks": self.replay_tasks.count,
            })
        if learner["learner"]:
            stats["learner"] = learner["learner"]
        return stats

    async def stop(self) -> None:
        """Stop the learner thread; the trainer stops the shard actors."""
        try:
            await self.runtime.get_async(self.learner.stop.remote(), timeout_s=10)
        except (ActorDiedError, TimeoutError) as exc:
            log.debug("learner stop: %s", exc)
