"""Replay shards as actors (RLlib's ReplayActor and BatchReplayActor).

A shard receives its :class:`~actorrl.replay.config.ReplayConfig` (across processes, its
``to_dict()``: see :func:`shard_config`). It holds ``buffer_size / num_shards`` rows and
starts replaying once it has seen ``learning_starts / num_shards`` env steps. Samples
arrive as refs and are fetched straight from the rollout worker that produced them (and
freed there). Every method is ``async`` so all of them run on the shard's event loop, one
at a time: the buffers need no locks.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from actorrl.data.batch import MultiAgentBatch, SampleBatch, as_multi_agent
from actorrl.replay.buffer import ReplayBuffer
from actorrl.replay.config import ReplayConfig
from actorrl.replay.frame_storage import FrameStackStorage
from actorrl.replay.prioritized import PrioritizedSampler
from actorrl.replay.sampler import UniformSampler
from actorrl.runtime import ObjectRef, Runtime
from actorrl.util.stats import TimerStat


def shard_config(config: ReplayConfig | Mapping[str, Any]) -> ReplayConfig:
    """The shard's :class:`ReplayConfig`: as given (what the Ape-X pipeline passes; it
    crosses to the actor typed), or loaded strictly from its section mapping."""
    if isinstance(config, ReplayConfig):
        return config
    if isinstance(config, Mapping):
        return ReplayConfig.load(config, path="replay.")
    raise TypeError(f"a replay shard takes a ReplayConfig (or its to_dict()), "
                    f"got {type(config).__name__}")


def shard_shares(config: ReplayConfig) -> tuple[int, int]:
    """One shard's ``(learning_starts, buffer_size)``: its part of each (the config
    guarantees at least one row per shard)."""
    shards = config.num_replay_buffer_shards
    return config.learning_starts // shards, config.buffer_size // shards


class ReplayActor:
    """A prioritized (or uniform) replay shard with one buffer per policy.

    ``config`` is the whole replay section (every shard gets the same and takes its
    share); ``seed`` seeds the shard's sampling.
    """

    def __init__(self, config: ReplayConfig | Mapping[str, Any], *,
                 seed: int | None = None) -> None:
        self.config = config = shard_config(config)
        self.replay_starts, self.buffer_size = shard_shares(config)
        self.train_batch_size = config.train_batch_size
        rng = np.random.default_rng(seed)

        def new_buffer() -> ReplayBuffer:
            # Frame stacks are stored (and sent to the learner) each frame once; other
            # observations are stored as they are.
            sampler = (PrioritizedSampler(config.prioritized_replay_alpha,
                                          config.prioritized_replay_beta,
                                          config.prioritized_replay_eps)
                       if config.prioritized_replay else UniformSampler())
            storage = FrameStackStorage(unpack=False, compress=config.compress_observations)
            return ReplayBuffer(self.buffer_size, sampler=sampler, storage=storage, seed=rng)

        self.replay_buffers: dict[str, ReplayBuffer] = collections.defaultdict(new_buffer)
        self.add_batch_timer = TimerStat()
        self.replay_timer = TimerStat()
        self.update_priorities_timer = TimerStat()
        self.num_added = 0
        self.num_replayed = 0
        """Train batches' rows this shard replayed (beta's annealing clock)."""

    async def add_batch(self, refs: list[ObjectRef]) -> int:
        """Fetch sample batches from their owners (freeing them there) and add them.
        Returns the env steps added."""
        batches = await Runtime.current().get_and_free_async(refs)
        added = 0
        with self.add_batch_timer:
            for batch in batches:
                for policy_id, rows in as_multi_agent(batch).policy_batches.items():
                    if rows.is_sequenced:
                        raise ValueError(
                            "a recurrent policy's sequences reached a per-row replay shard, "
                            "which would cut them apart: set batch_replay: true")
                    buffer = self.replay_buffers[policy_id]
                    rows = _replay_columns(rows)
                    if (self.config.worker_side_prioritization
                            and self.config.prioritized_replay):
                        # The workers computed |td_error| + eps into ``weights``.
                        buffer.add_batch(rows, priorities=rows[SampleBatch.WEIGHTS])
                    else:
                        buffer.add_batch(rows)
                added += batch.count
        self.num_added += added
        return added

    async def replay(self) -> MultiAgentBatch | None:
        """A train batch per policy, or None before ``learning_starts``."""
        if self.num_added < self.replay_starts or not self.replay_buffers:
            return None
        with self.replay_timer:
            samples = {}
            # Rows trained on so far, all shards together (each replays its share).
            beta = self.config.beta_after(self.num_replayed * self.config.num_replay_buffer_shards)
            for policy_id, buffer in self.replay_buffers.items():
                if isinstance(buffer.sampler, PrioritizedSampler):
                    buffer.sampler.beta = beta
                batch = buffer.sample(self.train_batch_size)
                if not self.config.prioritized_replay:  # uniform: every row weighs 1
                    batch[SampleBatch.WEIGHTS] = np.ones(batch.count, dtype=np.float32)
                samples[policy_id] = batch
        self.num_replayed += self.train_batch_size
        return MultiAgentBatch(samples, self.train_batch_size)

    async def update_priorities(self, prio_dict: dict[str, Any]) -> None:
        """Set priorities ``|td_error| + eps`` for the rows a train batch used:
        ``prio_dict`` maps policy id -> (batch_indexes, td_errors)."""
        with self.update_priorities_timer:
            for policy_id, (batch_indexes, td_errors) in prio_dict.items():
                buffer = self.replay_buffers.get(policy_id)
                if buffer is not None and isinstance(buffer.sampler, PrioritizedSampler):
                    buffer.update_priorities(np.asarray(batch_indexes),
                                             buffer.sampler.priorities_of(td_errors))

    async def stats(self, debug: bool = False) -> dict[str, Any]:
        """Timings (ms) and each policy buffer's stats."""
        stat: dict[str, Any] = {
            "add_batch_time_ms": round(1000 * self.add_batch_timer.mean, 3),
            "replay_time_ms": round(1000 * self.replay_timer.mean, 3),
            "update_priorities_time_ms": round(1000 * self.update_priorities_timer.mean, 3),
            "num_added": self.num_added,
        }
        for policy_id, buffer in self.replay_buffers.items():
            stat[f"policy_{policy_id}"] = buffer.stats(debug=debug)
        return stat

    async def ping(self) -> bool:
        """Liveness check."""
        return True


class BatchReplayActor:
    """Whole-batch FIFO replay for recurrent models: keeps sample batches (evicting the
    oldest once ``buffer_size / num_shards`` steps are held) and replays a random whole
    batch. Priorities are ignored. A recurrent policy's batches keep their sequences as
    they came: ``seq_lens``, each sequence's ``state_in_*`` start state and the rows in
    order (only frame-stack columns are held packed, rebuilt where a batch arrives)."""

    def __init__(self, config: ReplayConfig | Mapping[str, Any], *,
                 seed: int | None = None) -> None:
        self.config = config = shard_config(config)
        self.replay_starts, self.buffer_size = shard_shares(config)
        self.train_batch_size = config.train_batch_size
        self.buffer: collections.deque[MultiAgentBatch] = collections.deque()
        self.num_added = 0
        self.cur_size = 0
        self._random = random.Random(seed)

    async def add_batch(self, refs: list[ObjectRef]) -> int:
        """Fetch batches from their owners and keep them whole."""
        batches = await Runtime.current().get_and_free_async(refs)
        added = 0
        for batch in batches:
            ma = as_multi_agent(batch)
            # Frame stacks are kept as their packs (each frame once); a replayed batch is
            # rebuilt where it arrives.
            ma = MultiAgentBatch({pid: b.packed_form() for pid, b in ma.policy_batches.items()},
                                 ma.count)
            self.buffer.append(ma)
            self.cur_size += ma.count
            added += ma.count
            while self.cur_size > self.buffer_size and len(self.buffer) > 1:
                self.cur_size -= self.buffer.popleft().count
        self.num_added += added
        return added

    async def replay(self) -> MultiAgentBatch | None:
        """A random stored batch, or None before ``learning_starts``."""
        if self.num_added < self.replay_starts or not self.buffer:
            return None
        return self._random.choice(self.buffer)

    async def update_priorities(self, prio_dict: dict[str, Any]) -> None:
        """No priorities in batch replay."""

    async def stats(self, debug: bool = False) -> dict[str, Any]:
        """Current size and steps added."""
        return {"cur_size": self.cur_size, "num_added": self.num_added}

    async def ping(self) -> bool:
        """Liveness check."""
        return True


def _replay_columns(batch: SampleBatch) -> SampleBatch:
    """``batch`` with a ``weights`` column (all ones) when it has none, as replay needs."""
    if SampleBatch.WEIGHTS not in batch:
        pack = batch.frame_pack
        batch = SampleBatch(dict(batch), weights=np.ones(batch.count, dtype=np.float32))
        if pack is not None:  # same frame columns: the shard need not pack them again
            batch.attach_frame_pack(pack)
    return batch
