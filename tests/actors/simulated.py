"""Simulated rollout workers and a sink learner, for measuring the runtime at scale.

They stand in for :class:`actorrl.rollout.actor.RolloutWorkerActor` and
:class:`actorrl.learner.actor.LearnerActor` behind the real Ape-X and IMPALA pipelines
(``AlgorithmSpec.worker_class`` / ``learner_class``), so the coordinator, node agents,
transport and replay shards run unchanged while no env is stepped and no network trained:

- :class:`SimulatedWorker` answers ``sample_ref`` with a prebuilt batch of realistic size
  (``"pong"``: a 50-step fragment of 84x84x4 frame stacks as actorrl packs it, each frame
  once, ~375 kB on the wire; ``"cartpole"``: a 50-step CartPole fragment, ~4 kB) at up to
  ``sim_rate_hz`` batches per second (0: as fast as it is asked), and accepts weights;
- :class:`SinkLearner` fetches each train batch from its owner (as the real learner does),
  spends ``sim_learner_cost_s`` per batch, reports it trained (with ``td_error`` and
  ``batch_indexes`` for Ape-X's priorities) and bumps its weights version; its weights
  carry an :class:`EncodeCounter` that counts their wire encodings, so a benchmark can
  tell how many times one weights version was serialised.

Settings come through the algorithm's ``env_config`` (``sim_batch``, ``sim_rate_hz``,
``sim_learner_cost_s``, ``sim_weights_mb``), which reaches workers and learner unchanged.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from actorrl.config.sections import ConfigSection
from actorrl.data.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, as_multi_agent
from actorrl.data.frames import FRAME_COLUMNS, pack_frames, packable_columns
from actorrl.envs import EpisodeMetrics
from actorrl.messages import EnqueueReply, SampleReply, TrainedBatch, TrainedNotice
from actorrl.runtime import ObjectRef, Runtime
from transport.codec import register_type

FRAGMENT_STEPS = 50


def sim_settings(config: Mapping[str, Any] | ConfigSection) -> dict[str, Any]:
    """The ``env_config`` inside a worker config (typed, as actors receive it, or a dict;
    wherever its section put it)."""
    if isinstance(config, ConfigSection):
        config = config.to_dict()
    if "env_config" in config and isinstance(config["env_config"], Mapping):
        return dict(config["env_config"])
    for value in config.values():
        if isinstance(value, Mapping):
            found = sim_settings(value)
            if found:
                return found
    return {}


def pong_fragment(seed: int = 0, steps: int = FRAGMENT_STEPS) -> SampleBatch:
    """A ``steps``-step Pong fragment: 84x84x4 uint8 frame stacks (one new frame per step),
    ``new_obs`` one step later, the columns an IMPALA/Ape-X worker sends, with its frame
    pack attached (the wire sends each distinct frame once, as actorrl packs Pong)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (steps + 4, 84, 84), dtype=np.uint8)
    stacks = np.stack([frames[i: i + 4] for i in range(steps + 1)])  # [T+1, 4, 84, 84]
    stacks = np.ascontiguousarray(np.moveaxis(stacks, 1, -1))          # HWC
    batch = SampleBatch(
        obs=stacks[:-1], new_obs=stacks[1:],
        actions=rng.integers(0, 6, steps).astype(np.int64),
        rewards=np.zeros(steps, np.float32), terminateds=np.zeros(steps, bool),
        truncateds=np.zeros(steps, bool), eps_id=np.full(steps, seed, np.int64),
        action_logp=np.full(steps, -1.79, np.float32),
        action_dist_inputs=np.zeros((steps, 6), np.float32))
    packable = packable_columns(dict(batch))
    assert packable is not None and set(packable[0]) == set(FRAME_COLUMNS)
    names, axis = packable
    batch.attach_frame_pack(pack_frames({n: batch[n] for n in names}, axis))
    return batch


def cartpole_fragment(seed: int = 0, steps: int = FRAGMENT_STEPS) -> SampleBatch:
    """A ``steps``-step CartPole fragment (4 floats per observation)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(steps + 1, 4)).astype(np.float32)
    return SampleBatch(
        obs=obs[:-1], new_obs=obs[1:], actions=rng.integers(0, 2, steps).astype(np.int64),
        rewards=np.ones(steps, np.float32), terminateds=np.zeros(steps, bool),
        truncateds=np.zeros(steps, bool), eps_id=np.full(steps, seed, np.int64),
        action_logp=np.full(steps, -0.69, np.float32),
        action_dist_inputs=np.zeros((steps, 2), np.float32))


FRAGMENTS = {"pong": pong_fragment, "cartpole": cartpole_fragment}

PREBUILT: dict[str, SampleBatch] = {kind: build() for kind, build in FRAGMENTS.items()}
"""One fragment of each kind, built when this module is imported. A node whose fork server
preloads this module (``ACTORRL_FORK_PRELOAD``, as ``benchmarks/scale.py`` sets it) hands
them to every worker it forks in shared pages, so a simulated worker's start costs what the
runtime does to start an actor, not building ~1.4 MB of frames (half its start CPU)."""


class SimulatedWorker:
    """A rollout worker that samples nothing: ``sample_ref`` keeps the prebuilt fragment
    (:data:`PREBUILT`) here and replies with its ref.
    Constructor as :class:`~actorrl.rollout.actor.RolloutWorkerActor`."""

    def __init__(self, env: str, policy: str, config: Mapping[str, Any] | ConfigSection,
                 worker_index: int = 0, num_workers: int = 0, seed: int | None = None
                 ) -> None:
        settings = sim_settings(config)
        kind = settings.get("sim_batch", "cartpole")
        if kind not in FRAGMENTS:
            raise ValueError(f"env_config sim_batch must be one of {sorted(FRAGMENTS)}, "
                             f"got {kind!r}")
        self.batch = PREBUILT[kind]
        rate = float(settings.get("sim_rate_hz", 0.0))
        self.interval_s = 1.0 / rate if rate > 0 else 0.0
        self.next_at = 0.0
        self.worker_index = worker_index
        self.weights_version = -1
        self.num_sampled = 0

    async def sample_ref(self) -> SampleReply:
        """The fragment, kept here; at most ``sim_rate_hz`` replies per second."""
        if self.interval_s:
            now = time.monotonic()
            self.next_at = max(self.next_at + self.interval_s, now)
            if self.next_at > now:
                await asyncio.sleep(self.next_at - now)
        self.num_sampled += 1
        return SampleReply(batch=Runtime.current().put(self.batch), count=self.batch.count,
                           agent_steps=self.batch.count, worker_index=self.worker_index)

    def set_weights(self, payload: Mapping[str, Any], global_timestep: int | None = None
                    ) -> int:
        """Accept a learner's ``{"version", "weights"}`` payload; returns its version."""
        self.weights_version = int(payload.get("version", self.weights_version + 1))
        return self.weights_version

    def set_global_timestep(self, timestep: int) -> None:
        """Nothing to schedule."""

    def get_metrics(self) -> EpisodeMetrics:
        """No episodes are played."""
        return EpisodeMetrics()

    def ping(self) -> int:
        """Liveness check; returns the worker index."""
        return self.worker_index

    def stop(self) -> None:
        """Nothing to close."""


class EncodeCounter:
    """A marker placed in the weights payload: each wire encoding of the payload encodes
    it once, and counts (per process) in :attr:`encodings`."""

    encodings = 0


def _count_encoding(_marker: EncodeCounter) -> int:
    EncodeCounter.encodings += 1
    return 0


register_type(EncodeCounter, "tests.EncodeCounter", _count_encoding,
              lambda _state: EncodeCounter())


@dataclass
class _Queued:
    tag: Any
    batch: MultiAgentBatch


class SinkLearner:
    """A learner that trains nothing. Constructor as
    :class:`~actorrl.learner.actor.LearnerActor`; the in-queue holds
    ``learner_queue_size`` batches."""

    def __init__(self, env: str, policy: str, worker_config: Mapping[str, Any] | ConfigSection,
                 learner_config: Mapping[str, Any] | ConfigSection, start_thread: bool = True,
                 sampling: bool = False) -> None:
        # sampling (the learner's own worker sampling, A2C with num_workers 0): never here
        settings = sim_settings(worker_config)
        self.cost_s = float(settings.get("sim_learner_cost_s", 0.0))
        size = int(float(settings.get("sim_weights_mb", 1.0)) * 2**20) // 4
        self.weights = {"w": np.zeros(size, np.float32), "encodings": EncodeCounter()}
        if isinstance(learner_config, ConfigSection):
            learner_config = learner_config.to_dict()
        self.capacity = int(learner_config.get("learner_queue_size", 16))
        self.inqueue: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self.queued = 0
        self.results: list[TrainedBatch] = []
        self.version = 0
        self.num_steps_trained = 0
        self.num_weight_gets = 0
        self._trained: asyncio.Event | None = None
        self._room: asyncio.Event | None = None
        self._consumer: asyncio.Task | None = None
        self.stopped = False

    def _start(self) -> None:
        if self._consumer is None:
            self._trained, self._room = asyncio.Event(), asyncio.Event()
            self._consumer = asyncio.get_running_loop().create_task(self._consume())

    async def _consume(self) -> None:
        assert self._trained is not None and self._room is not None
        while not self.stopped:
            try:
                item = self.inqueue.get_nowait()
            except queue.Empty:
                self._room.set()
                await self._wait_item()
                continue
            self.queued -= 1
            self._room.set()
            if self.cost_s:
                await asyncio.sleep(self.cost_s)
            per_sample = {}
            for pid, rows in item.batch.policy_batches.items():
                if SampleBatch.BATCH_INDEXES in rows:
                    per_sample[pid] = {"batch_indexes": rows[SampleBatch.BATCH_INDEXES],
                                       "td_error": np.ones(rows.count, np.float32)}
            self.version += 1
            self.num_steps_trained += item.batch.count
            self.results.append(TrainedBatch(tag=item.tag, env_steps=item.batch.count,
                                             agent_steps=item.batch.count,
                                             per_sample=per_sample))
            self._trained.set()

    async def _wait_item(self) -> None:
        self._item_event = asyncio.Event()
        await self._item_event.wait()

    def _put(self, item: _Queued) -> None:
        self.inqueue.put(item)
        self.queued += 1
        event = getattr(self, "_item_event", None)
        if event is not None:
            event.set()

    async def enqueue_refs(self, tag: Any, refs: list[ObjectRef], block: bool = True,
                           timeout_s: float = 600.0) -> EnqueueReply:
        """Fetch the batches from their owners (freeing them there) and queue them."""
        self._start()
        runtime = Runtime.current()
        if not block and self.queued >= self.capacity:
            runtime.free(refs)
            return EnqueueReply(queued=False, dropped=True, count=0, queue_size=self.queued)
        started = time.perf_counter()
        batches = [b for b in await runtime.get_and_free_async(refs) if b is not None]
        fetched_s = time.perf_counter() - started
        if not batches:
            return EnqueueReply(queued=False, dropped=False, count=0,
                                queue_size=self.queued, fetch_time_s=fetched_s)
        merged = [as_multi_agent(b) for b in batches]
        count = sum(b.count for b in merged)
        batch = merged[0] if len(merged) == 1 else MultiAgentBatch(
            {DEFAULT_POLICY_ID: SampleBatch.concat_samples(
                [b.policy_batches[DEFAULT_POLICY_ID] for b in merged])}, count)
        assert self._room is not None
        while block and self.queued >= self.capacity and not self.stopped:
            self._room.clear()
            await asyncio.wait_for(self._room.wait(), timeout_s)
        if not block and self.queued >= self.capacity:
            return EnqueueReply(queued=False, dropped=True, count=0, queue_size=self.queued)
        self._put(_Queued(tag, batch))
        return EnqueueReply(queued=True, dropped=False, count=count, queue_size=self.queued,
                            fetch_time_s=fetched_s)

    async def owners_died(self, endpoints: list[str], reason: str) -> None:
        """As the real learner: fetches from the dead workers fail now."""
        runtime = Runtime.current()
        for endpoint in endpoints:
            runtime.mark_dead(endpoint, reason)

    async def wait_trained(self, timeout_s: float = 30.0) -> TrainedNotice:
        """The batches trained since the last call (waiting up to ``timeout_s``)."""
        self._start()
        assert self._trained is not None
        if not self.results and not self.stopped:
            self._trained.clear()
            try:
                await asyncio.wait_for(self._trained.wait(), timeout_s)
            except TimeoutError:
                pass
        results, self.results = self.results, []
        return TrainedNotice(results=tuple(results), weights_version=self.version,
                             num_steps_trained=self.num_steps_trained)

    def get_weights(self) -> dict[str, Any]:
        """``{"version": v, "weights": {policy_id: {name: array}}}`` (and the marker that
        counts its encodings)."""
        self.num_weight_gets += 1
        return {"version": self.version, "weights": {DEFAULT_POLICY_ID: self.weights}}

    def set_weights(self, weights: Mapping[str, Any]) -> int:
        """Accept weights; returns the new version."""
        self.version += 1
        return self.version

    def set_global_timestep(self, timestep: int) -> None:
        """Nothing to schedule."""

    def stats(self) -> dict[str, Any]:
        """Counters, including how often the weights were encoded for the wire."""
        return {"learner_queue": {"size_mean": float(self.queued)}, "learner": {},
                "timing_breakdown": {}, "num_steps": self.version,
                "weights_updated": self.version > 0, "device": "cpu", "num_towers": 1,
                "weight_encodings": EncodeCounter.encodings,
                "weight_gets": self.num_weight_gets,
                "num_steps_trained": self.num_steps_trained}

    def get_state(self) -> dict[str, Any]:
        """Counters only."""
        return {"policies": {}, "version": self.version,
                "num_steps_trained": self.num_steps_trained}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore counters."""
        self.version = int(state.get("version", 0))

    async def stop(self) -> None:
        """Stop consuming; waiting puts return."""
        self.stopped = True
        if self._room is not None:
            self._room.set()
        if self._consumer is not None:
            self._consumer.cancel()
