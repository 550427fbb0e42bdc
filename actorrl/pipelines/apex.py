"""Ape-X's dataflow (RLlib's AsyncReplayOptimizer), read top to bottom.

Actors: rollout workers, ``num_replay_buffer_shards`` replay shards, one learner process.
In flight: 2 ``sample`` calls per worker (SAMPLE_QUEUE_DEPTH); as many ``replay`` calls
as the learner has room for (a credit window of ``learner_queue_size + 1`` batches, at
most REPLAY_QUEUE_DEPTH per shard); one ``wait_trained`` call the learner answers as soon
as it trained a batch.

Each step handles whatever finished:

1. A finished sample goes from its worker straight to a random shard (the coordinator
   passes the ref). The worker's step counter grows; past ``max_weight_sync_delay`` it gets
   the learner's weights (a fresh ``get_weights`` only if the learner has updated since the
   last one). Then it samples again, unless the pacer parks it (``training_intensity``:
   RLlib's later key, None in the original Ape-X; the learner must have trained on that
   many rows per sampled env step before sampling goes on). A worker that died is
   replaced; when a worker's ``sample`` raises, the step's other samples are still used
   and the workers re-dispatched, then the error is raised (as RLlib does).
2. A finished replay goes to the learner's bounded in-queue (the learner fetches it from
   the shard). Each replay was requested with a credit, which comes back when the learner
   reports the batch trained (or lost, or empty): so the shard replays only what the
   learner has room for, and a slow learner costs no wasted replay work. A refusal (the
   rare batch that finds the queue full) is counted in ``num_samples_dropped`` and its
   credit held until the learner trains again. While the learner owes batches and
   trains none, ``learner_stall_s`` grows.
3. A trained notice carries ``td_error`` per row; ``|td_error| + eps`` go back, as new
   priorities, to the shard the batch came from (tagged with an id the shard keeps for
   life, so priorities never reach the empty shard that replaced a dead one). A dead
   shard is replaced by an empty one at the same index (``num_shard_failures``); pacing
   restarts then, so sampling runs unpaced for another ``learning_starts`` steps while
   the new shard refills.

With ``pace_learner_rows`` (SAC: RLlib's synchronous loop alternates sampling and
training) the learner is paced as well: a replay is requested only while the rows trained
and requested stay within a slack of ``training_intensity`` rows per env step sampled (two
of the largest samples' worth plus one batch, so sampling and learning still overlap), and
the replay ratio is exact to within that slack instead of a floor.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from actorrl.messages import EnqueueReply, SampleReply, TrainedNotice
from actorrl.pipelines.pieces import (
    CreditWindow,
    Fleet,
    FleetPipelineMixin,
    RateWindow,
    ReplaceWorker,
    SamplingPacer,
    TaskPool,
    TrainingIntensity,
    Wakeup,
)
from actorrl.runtime import ActorDiedError, ActorHandle, ObjectLostError, ObjectRef, Runtime
from actorrl.util.failures import failure_line
from actorrl.util.stats import TimerStat

log = logging.getLogger(__name__)

SAMPLE_QUEUE_DEPTH = 2
REPLAY_QUEUE_DEPTH = 4
TRAINED_WAIT_S = 30.0


class AsyncReplayOptimizer(FleetPipelineMixin):
    """The Ape-X pipeline over remote workers, replay shard actors and a learner actor."""

    def __init__(self, runtime: Runtime, workers: list[ActorHandle],
                 replay_actors: list[ActorHandle], learner: ActorHandle, *,
                 learner_queue_size: int, max_weight_sync_delay: int,
                 training_intensity: float | None = None, learning_starts: int = 0,
                 replace_shard: ReplaceWorker | None = None, debug: bool = False,
                 replace_worker: ReplaceWorker | None = None, seed: int | None = None,
                 pace_learner_rows: int | None = None) -> None:
        self._attach(runtime, workers, learner, replace_worker,
                     no_workers="Ape-X needs at least one remote rollout worker "
                                "(num_workers >= 1)")
        if not replay_actors:
            raise ValueError("Ape-X needs at least one replay shard")
        self.shard_fleet = Fleet(replay_actors, replace_shard, "replay shard")
        self.max_weight_sync_delay = max_weight_sync_delay
        self.debug = debug
        self.intensity = TrainingIntensity(self.counters, training_intensity, learning_starts)
        self.pacer = SamplingPacer(self.intensity.ahead)
        self.pace_learner_rows = pace_learner_rows
        """Rows per replayed batch when the learner is paced too (None: it is not)."""
        self._largest_sample = 1
        self._next_shard = 0
        # The learner's in-queue plus the batch it is training on.
        self.credits = CreditWindow(learner_queue_size + 1)
        # Replays are tagged with an id their shard keeps for life (a replacement gets a new
        # one), so priorities computed after a shard died never reach another shard.
        self._shards_by_id = dict(enumerate(replay_actors))
        self._next_shard_id = len(replay_actors)
        self._random = random.Random(seed)
        self.timers = {k: TimerStat() for k in (
            "put_weights", "get_samples", "sample_processing", "replay_processing",
            "update_priorities", "train", "sample")}
        self.sample_rate = RateWindow()
        self.train_rate = RateWindow()
        self.num_weight_syncs = 0
        self.num_samples_dropped = 0
        self.learning_started = False
        self._learner_idle_since: float | None = None
        self.steps_since_update: dict[ActorHandle, int] = {}
        self.weights: ObjectRef | None = None
        self.weights_version = -1
        self.learner_version = 0
        self._wakeup = Wakeup()
        self.sample_tasks = TaskPool(runtime, self._wakeup)
        self.replay_tasks = TaskPool(runtime, self._wakeup)
        self.learner_tasks = TaskPool(runtime, self._wakeup)
        self._set_workers(workers)
        self._request_replays()
        self.learner_tasks.add(learner, learner.wait_trained.remote(TRAINED_WAIT_S))

    @property
    def replay_actors(self) -> list[ActorHandle]:
        """The live replay shards."""
        return self.shard_fleet.actors

    def _set_workers(self, workers: list[ActorHandle]) -> None:
        for worker in workers:
            self.steps_since_update[worker] = 0
            for _ in range(SAMPLE_QUEUE_DEPTH):
                self.sample_tasks.add(worker, worker.sample_ref.remote())

    def _request_replays(self) -> None:
        """Spend the free credits on replays, least busy shard first, ties taken in turn
        (none before ``learning_starts`` steps were sampled: the shards could not replay
        yet)."""
        if self.num_steps_sampled < self.intensity.learning_starts:
            return
        while self.credits.available and self._learner_has_room():
            shard = self._least_busy_shard()
            if self.replay_tasks.count_for(shard) >= REPLAY_QUEUE_DEPTH:
                return
            self.credits.take()
            self.replay_tasks.add(shard, shard.replay.remote())

    def _least_busy_shard(self) -> ActorHandle:
        """The shard with the fewest replays pending; among equals, the next after the last
        one asked. (Always the first of equals, a paced learner asking one replay at a time
        asked only shard 0, which may be below its share of ``learning_starts`` while
        sampling waits for the learner: a deadlock.)"""
        shards = self.replay_actors
        start = self._next_shard % len(shards)
        order = shards[start:] + shards[:start]
        shard = min(order, key=self.replay_tasks.count_for)
        self._next_shard = shards.index(shard) + 1
        return shard

    def _learner_has_room(self) -> bool:
        """Without ``pace_learner_rows``: always. With it: whether one more batch keeps the
        rows trained and requested within the slack of the training intensity."""
        rows = self.pace_learner_rows
        if rows is None or self.intensity.intensity is None:
            return True
        slack = int(2 * self.intensity.intensity * self._largest_sample) + rows
        return self.intensity.learner_room((self.credits.in_use + 1) * rows, slack)

    # ---- the step ---------------------------------------------------------------------
    async def step(self, timeout_s: float = 1.0) -> None:
        """One pass over everything that finished (waiting up to ``timeout_s`` for it)."""
        started = time.perf_counter()
        await self._wakeup.wait(timeout_s)
        sampled, trained = self.num_steps_sampled, self.num_steps_trained
        try:
            # Samples first: a shard replaced below starts its pacing after them.
            await self._process_samples()
            await self._process_replays()
            await self._process_learner_replies()
            for worker in self.pacer.release():
                self.sample_tasks.add(worker, worker.sample_ref.remote())
            self._request_replays()
        finally:
            self.sample_rate.add(self.num_steps_sampled - sampled)
            self.train_rate.add(self.num_steps_trained - trained)
            # The seeds' step timers: every step's duration (waiting included) with the
            # env steps it sampled; with the rows it trained once learning started.
            duration = time.perf_counter() - started
            self.timers["sample"].push(duration)
            self.timers["sample"].push_units_processed(self.num_steps_sampled - sampled)
            if self.learning_started:
                self.timers["train"].push(duration)
                self.timers["train"].push_units_processed(self.num_steps_trained - trained)

    async def _process_samples(self) -> None:
        """Route finished samples; raise a worker's error once the others are handled."""
        error: BaseException | None = None
        died: list[tuple[ActorHandle, BaseException]] = []
        with self.timers["sample_processing"]:
            sample_steps = 0
            for worker, ref in await self.sample_tasks.completed(0):
                try:
                    reply: SampleReply = await self.runtime.get_async(ref)
                except ActorDiedError as exc:
                    died.append((worker, exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - raised after the healthy ones
                    log.warning("rollout worker %s: sample failed: %s",
                                worker.name or repr(worker), failure_line(exc))
                    error = error or exc
                    continue
                sample_steps += reply.count
                self._largest_sample = max(self._largest_sample, reply.count)
                self._random.choice(self.replay_actors).add_batch.remote([reply.batch])
                self.steps_since_update[worker] = (
                    self.steps_since_update.get(worker, 0) + reply.count)
                if self.steps_since_update[worker] >= self.max_weight_sync_delay:
                    self._sync_weights(worker)
                if self.pacer.admit(worker, sample_steps):
                    self.sample_tasks.add(worker, worker.sample_ref.remote())
            self.counters.num_steps_sampled += sample_steps
        self.worker_fleet.check()
        died += self.pacer.dead(self.runtime)
        if died:  # the survivors go on sampling while the replacements start
            self.worker_fleet.replace_in_background(died, self._forget_worker,
                                                    self._set_workers)
        if error is not None:
            raise error

    def _sync_weights(self, worker: ActorHandle) -> None:
        # Pull new weights only when the learner has updated since the last pull.
        if self.weights is None or self.learner_version > self.weights_version:
            with self.timers["put_weights"]:
                self.weights = self.learner.get_weights.remote()
                self.weights_version = self.learner_version
        worker.set_weights.remote(self.weights, self.counters.global_timestep)
        self.num_weight_syncs += 1
        self.steps_since_update[worker] = 0

    async def _process_replays(self) -> None:
        with self.timers["replay_processing"]:
            for shard, ref in await self.replay_tasks.completed(0):
                error = self.runtime.call_error(ref)
                if isinstance(error, ActorDiedError):
                    self.credits.give_back()
                    await self._shard_failed(shard, error)
                    continue
                self.learner_tasks.add(self.learner, self.learner.enqueue_refs.remote(
                    self._shard_id(shard), [ref], False))

    async def _process_learner_replies(self) -> None:
        with self.timers["update_priorities"]:
            for _, ref in await self.learner_tasks.completed(0):
                try:
                    reply = await self.runtime.get_async(ref)
                except ObjectLostError:
                    # The replay's shard died before the learner fetched it: a lost batch.
                    self.credits.give_back()
                    continue
                if isinstance(reply, EnqueueReply):
                    self._on_enqueued(reply)
                else:
                    self._on_trained(reply)
                    self.learner_tasks.add(
                        self.learner, self.learner.wait_trained.remote(TRAINED_WAIT_S))
        self._watch_learner()

    def _on_enqueued(self, reply: EnqueueReply) -> None:
        if reply.count:
            self.timers["get_samples"].push(reply.fetch_time_s)
        if reply.dropped:
            self.num_samples_dropped += 1
            self.credits.refused()
        elif not reply.queued:  # nothing to train on (a shard before learning_starts)
            self.credits.give_back()

    def _on_trained(self, notice: TrainedNotice) -> None:
        self.learner_version = notice.weights_version
        self.credits.trained(len(notice.results))
        for result in notice.results:
            self.counters.num_steps_trained += result.env_steps
            self.learning_started = True
            shard = self._shards_by_id.get(result.tag)
            prio_dict = {
                pid: (rows["batch_indexes"], rows["td_error"])
                for pid, rows in result.per_sample.items()
                if "batch_indexes" in rows and "td_error" in rows
            }
            if prio_dict and shard is not None:
                shard.update_priorities.remote(prio_dict)
        if notice.results:
            self._learner_idle_since = None

    def _watch_learner(self) -> None:
        """Start the stall clock when the learner owes batches and trains none."""
        owes = self.credits.in_use > self.replay_tasks.count
        if not owes:
            self._learner_idle_since = None
        elif self._learner_idle_since is None:
            self._learner_idle_since = time.perf_counter()

    @property
    def learner_stall_s(self) -> float:
        """Seconds the learner has held batches without reporting one trained (0 when it
        holds none or just trained)."""
        if self._learner_idle_since is None:
            return 0.0
        return time.perf_counter() - self._learner_idle_since

    def _shard_id(self, shard: ActorHandle) -> int:
        return next((i for i, s in self._shards_by_id.items() if s == shard), -1)

    def _forget_shard(self, shard: ActorHandle) -> None:
        self.credits.give_back(self.replay_tasks.count_for(shard))
        self.replay_tasks.remove_actor(shard)
        del self._shards_by_id[self._shard_id(shard)]

    async def _shard_failed(self, shard: ActorHandle, exc: BaseException) -> None:
        """A replay shard died: its replay data is lost (reported); a fresh, empty shard
        takes its index and sampling and training go on."""
        new = await self.shard_fleet.failed(shard, exc, self._forget_shard)
        if not self.replay_actors:
            raise RuntimeError("every replay shard died and none could be replaced")
        if new is not None:
            self._shards_by_id[self._next_shard_id] = new
            self._next_shard_id += 1
            self.intensity.restart()

    def _forget_worker(self, worker: ActorHandle) -> None:
        self.sample_tasks.remove_actor(worker)
        self.steps_since_update.pop(worker, None)
        self.pacer.keep(w for w in self.workers if w != worker)

    # ---- the PolicyOptimizer surface --------------------------------------------------
    @property
    def num_shard_failures(self) -> int:
        """Replay shards that died (their data lost)."""
        return self.shard_fleet.num_failures

    def reset(self, workers: list[ActorHandle]) -> None:
        """Swap the worker set."""
        self.sample_tasks.reset_workers(workers)
        self.pacer.keep(workers)
        added = [w for w in workers if w not in self.workers]
        self.worker_fleet.actors = list(workers)
        self.steps_since_update = {w: self.steps_since_update.get(w, 0) for w in workers}
        self._set_workers(added)

    async def stats(self) -> dict[str, Any]:
        """RLlib's AsyncReplayOptimizer stats (timing and pending counts with ``debug``),
        plus the credit window and the learner-stall gauge."""
        learner = await self.runtime.get_async(self.learner.stats.remote(), timeout_s=60)
        try:
            replay_stats = await self.runtime.get_async(
                self.replay_actors[0].stats.remote(self.debug), timeout_s=60)
        except ActorDiedError as exc:  # replaced at the next step
            replay_stats = {"error": str(exc)}
        stats: dict[str, Any] = {
            **self.counters.stats(),
            "sample_throughput": round(self.sample_rate.rate, 3),
            "train_throughput": round(self.train_rate.rate if self.learning_started else 0.0,
                                      3),
            "num_weight_syncs": self.num_weight_syncs,
            "num_samples_dropped": self.num_samples_dropped,
            "num_worker_failures": self.num_worker_failures,
            "num_shard_failures": self.num_shard_failures,
            "parked_sample_requests": len(self.pacer.parked),
            "learner_credits_in_use": self.credits.in_use,
            "learner_stall_s": round(self.learner_stall_s, 3),
            "learner_queue": learner["learner_queue"],
            "replay_shard_0": replay_stats,
        }
        if self.debug:
            timing = {f"{k}_time_ms": round(1000 * t.mean, 3) for k, t in self.timers.items()}
            timing["learner_grad_time_ms"] = learner["timing_breakdown"][
                "learner_grad_time_ms"]
            timing["learner_dequeue_time_ms"] = learner["timing_breakdown"][
                "learner_dequeue_time_ms"]
            stats.update({
                "timing_breakdown": timing,
                "pending_sample_tasks": self.sample_tasks.count,
                "pending_replay_tasks": self.replay_tasks.count,
            })
        if learner["learner"]:
            stats["learner"] = learner["learner"]
        return stats
