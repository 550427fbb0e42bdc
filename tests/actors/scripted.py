"""Scripted actors for pipeline-semantics tests: fixed sample sizes, recorded calls."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import actorrl.runtime as rt
from actorrl.data.batch import SampleBatch
from actorrl.envs import EpisodeMetrics
from actorrl.learner.actor import LearnerActor
from actorrl.messages import SampleReply
from actorrl.replay.actor import ReplayActor
from actorrl.rollout.actor import RolloutWorkerActor


def cartpole_like_batch(count: int, rng: np.random.Generator) -> SampleBatch:
    """A batch with the columns a DQN policy trains on, CartPole-shaped."""
    return SampleBatch(
        obs=rng.normal(size=(count, 4)).astype(np.float32),
        actions=rng.integers(0, 2, count).astype(np.int64),
        rewards=np.ones(count, dtype=np.float32),
        new_obs=rng.normal(size=(count, 4)).astype(np.float32),
        terminateds=rng.random(count) < 0.05,
        truncateds=np.zeros(count, dtype=bool),
        n_steps=np.ones(count, dtype=np.int32),
        weights=np.ones(count, dtype=np.float32),
    )


class ScriptedWorker:
    """Returns ``count``-row batches and records every weight sync it receives."""

    def __init__(self, count: int = 100, seed: int = 0) -> None:
        self.count = count
        self.rng = np.random.default_rng(seed)
        self.samples = 0
        self.weight_syncs: list[int] = []  # samples taken before each sync

    def sample_ref(self) -> SampleReply:
        self.samples += 1
        batch = cartpole_like_batch(self.count, self.rng)
        return SampleReply(batch=rt.put(batch), count=self.count, agent_steps=self.count,
                           worker_index=1)

    def sample(self) -> SampleBatch:
        self.samples += 1
        return cartpole_like_batch(self.count, self.rng)

    def set_weights(self, payload: Any, global_timestep: int | None = None) -> int:
        self.weight_syncs.append(self.samples)
        return len(self.weight_syncs)

    def get_metrics(self) -> EpisodeMetrics:
        return EpisodeMetrics()

    def record(self) -> dict[str, Any]:
        return {"samples": self.samples, "weight_syncs": self.weight_syncs}


class RecordingReplayActor(ReplayActor):
    """A replay shard that remembers the exact batch_indexes of each replay it served and
    of each priority update it received."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served: list[bytes] = []
        self.updates: list[bytes] = []

    async def replay(self):
        batch = await super().replay()
        if batch is not None:
            for policy_batch in batch.policy_batches.values():
                self.served.append(policy_batch["batch_indexes"].tobytes())
        return batch

    async def update_priorities(self, prio_dict: dict[str, Any]) -> None:
        for batch_indexes, _td in prio_dict.values():
            self.updates.append(np.asarray(batch_indexes).tobytes())
        await super().update_priorities(prio_dict)

    async def record(self) -> dict[str, Any]:
        return {"served": self.served, "updates": self.updates}


class VersionRecordingWorker(RolloutWorkerActor):
    """A real rollout worker that records the version of every weights payload it gets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.versions: list[int] = []

    def set_weights(self, payload: Any, global_timestep: int | None = None) -> int:
        version = super().set_weights(payload, global_timestep)
        self.versions.append(version)
        return version

    def versions_seen(self) -> list[int]:
        return self.versions


class SlowApplyLearnerActor(LearnerActor):
    """A learner whose every gradient apply takes at least ``APPLY_FLOOR_S`` more than the
    real one, inside the apply (under the update lock, so applies stay serialized): a
    known lower bound for what the A3C pipeline's ``apply_time_ms`` must report."""

    APPLY_FLOOR_S = 0.05

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        real_apply = self.worker.apply_gradients
        never_set = threading.Event()

        def apply_with_floor(grads: Any) -> Any:
            never_set.wait(self.APPLY_FLOOR_S)  # simulated work, not synchronisation
            return real_apply(grads)

        self.worker.apply_gradients = apply_with_floor
