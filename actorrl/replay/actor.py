"""Replay shards as actors (RLlib's ReplayActor and BatchReplayActor).

A shard receives its :class:`~actorrl.replay.config.ReplayConfig` (or that config's
mapping). It holds ``buffer_size / num_shards`` rows and starts replaying once it has seen
``learning_starts / num_shards`` env steps. Samples arrive as refs and are fetched straight
from the rollout worker that produced them (and freed there). Every method is ``async``
so all of them run on the shard's event loop, one at a time: the buffers need no locks.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from actorrl.batch import MultiAgentBatch, SampleBatch, as_multi_agent
from actorrl.metrics import TimerStat
from actorrl.replay.buffer import PrioritizedReplayBuffer, ReplayBuffer
from actorrl.replay.config import ReplayConfig
from actorrl.replay.frame_buffer import FramePrioritizedReplayBuffer, FrameReplayBuffer
from actorrl.runtime import ObjectRef, Runtime


def _shard_share(total: int, num_shards: int, what: str) -> int:
    if num_shards < 1:
        raise ValueError(f"num_replay_buffer_shards must be >= 1, got {num_shards}")
    if total < 0:
        raise ValueError(f"{what} must be >= 0, got {total}")
    return total // num_shards


_LEGACY_ORDER = ("num_replay_buffer_shards", "learning_starts", "buffer_size",
                 "train_batch_size", "prioritized_replay_alpha", "prioritized_replay_beta",
                 "prioritized_replay_eps", "prioritized_replay")


def replay_config_of(config: ReplayConfig | Mapping[str, Any] | int, legacy: tuple,
                     legacy_kwargs: Mapping[str, Any]) -> ReplayConfig:
    """A shard's :class:`ReplayConfig`: given, loaded from its mapping (strict), or from the
    older positional form ``(num_shards, learning_starts, buffer_size, train_batch_size,
    alpha, beta, eps, prioritized)`` plus keyword settings."""
    if isinstance(config, ReplayConfig):
        if legacy or legacy_kwargs:
            raise TypeError("a replay shard takes a ReplayConfig and seed=..., nothing else")
        return config
    if isinstance(config, Mapping):
        if legacy or legacy_kwargs:
            raise TypeError("a replay shard takes a ReplayConfig mapping and seed=..., "
                            "nothing else")
        return ReplayConfig.load(config, path="replay.")
    positional = (config, *legacy)
    if len(positional) > len(_LEGACY_ORDER):
        raise TypeError(f"a replay shard takes at most {len(_LEGACY_ORDER)} positional "
                        f"settings ({', '.join(_LEGACY_ORDER)}), got {len(positional)}")
    values = dict(zip(_LEGACY_ORDER, positional))
    values.update(legacy_kwargs)
    return ReplayConfig.load(values, path="replay.")


class ReplayActor:
    """A prioritized (or uniform) replay shard with one buffer per policy."""

    def __init__(self, config: ReplayConfig | Mapping[str, Any] | int, *legacy: Any,
                 seed: int | None = None, **legacy_kwargs: Any) -> None:
        cfg = replay_config_of(config, legacy, legacy_kwargs)
        self.config = cfg
        num_shards, buffer_size = cfg.num_replay_buffer_shards, cfg.buffer_size
        learning_starts = cfg.learning_starts
        train_batch_size = cfg.train_batch_size
        prioritized_replay_alpha = cfg.prioritized_replay_alpha
        prioritized_replay_beta = cfg.prioritized_replay_beta
        prioritized_replay_eps = cfg.prioritized_replay_eps
        prioritized_replay = cfg.prioritized_replay
        worker_side_prioritization = cfg.worker_side_prioritization
        self.replay_starts = _shard_share(learning_starts, num_shards, "learning_starts")
        self.buffer_size = _shard_share(buffer_size, num_shards, "buffer_size")
        self.worker_side_prioritization = worker_side_prioritization
        if self.buffer_size < 1:
            raise ValueError(
                f"buffer_size ({buffer_size}) must give every one of the "
                f"{num_shards} shards at least one row"
            )
        self.train_batch_size = train_batch_size
        self.beta = prioritized_replay_beta
        self.eps = prioritized_replay_eps
        self.prioritized = prioritized_replay
        rng = np.random.default_rng(seed)

        def new_buffer() -> ReplayBuffer:
            # Frame stacks are stored (and sent to the learner) each frame once; other
            # observations are stored as they are.
            if self.prioritized:
                return FramePrioritizedReplayBuffer(
                    self.buffer_size,
                    alpha=prioritized_replay_alpha,
                    eps=prioritized_replay_eps,
                    unpack=False,
                    compress=cfg.compress_observations,
                    seed=rng,
                )
            return FrameReplayBuffer(self.buffer_size, unpack=False,
                                     compress=cfg.compress_observations, seed=rng)

        self.replay_buffers: dict[str, ReplayBuffer] = collections.defaultdict(new_buffer)
        self.add_batch_timer = TimerStat()
        self.replay_timer = TimerStat()
        self.update_priorities_timer = TimerStat()
        self.num_added = 0

    async def add_batch(self, refs: list[ObjectRef]) -> int:
        """Fetch sample batches from their owners (freeing them there) and add them.
        Returns the env steps added."""
        batches = await Runtime.current().get_and_free_async(refs)
        added = 0
        with self.add_batch_timer:
            for batch in batches:
                for policy_id, rows in as_multi_agent(batch).policy_batches.items():
                    buffer = self.replay_buffers[policy_id]
                    rows = _replay_columns(rows)
                    if self.worker_side_prioritization and isinstance(
                            buffer, PrioritizedReplayBuffer):
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
            for policy_id, buffer in self.replay_buffers.items():
                if isinstance(buffer, PrioritizedReplayBuffer):
                    samples[policy_id] = buffer.sample(self.train_batch_size, beta=self.beta)
                else:
                    batch = buffer.sample(self.train_batch_size)
                    batch[SampleBatch.WEIGHTS] = np.ones(batch.count, dtype=np.float32)
                    samples[policy_id] = batch
        return MultiAgentBatch(samples, self.train_batch_size)

    async def update_priorities(self, prio_dict: dict[str, Any]) -> None:
        """Set priorities ``|td_error| + eps`` for the rows a train batch used:
        ``prio_dict`` maps policy id -> (batch_indexes, td_errors)."""
        with self.update_priorities_timer:
            for policy_id, (batch_indexes, td_errors) in prio_dict.items():
                buffer = self.replay_buffers.get(policy_id)
                if isinstance(buffer, PrioritizedReplayBuffer):
                    priorities = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps
                    buffer.update_priorities(np.asarray(batch_indexes), priorities)

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
    batch. Priorities are ignored."""

    def __init__(self, config: ReplayConfig | Mapping[str, Any] | int, *legacy: Any,
                 seed: int | None = None, **legacy_kwargs: Any) -> None:
        cfg = replay_config_of(config, legacy, legacy_kwargs)
        self.config = cfg
        num_shards, buffer_size = cfg.num_replay_buffer_shards, cfg.buffer_size
        learning_starts, train_batch_size = cfg.learning_starts, cfg.train_batch_size
        self.replay_starts = _shard_share(learning_starts, num_shards, "learning_starts")
        self.buffer_size = _shard_share(buffer_size, num_shards, "buffer_size")
        self.train_batch_size = train_batch_size
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
