"""``RolloutWorkerActor``: the remote face of a :class:`RolloutWorker`.

A thin adapter: each method forwards to the worker. ``sample_ref`` keeps the sampled batch
in this process and returns only a ref and counts, so the coordinator routes refs while the
data moves straight from here to whoever consumes it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from actorrl.config.rollout import WorkerConfig
from actorrl.data.batch import MultiAgentBatch, SampleBatch
from actorrl.envs import EpisodeMetrics
from actorrl.messages import GradientsReply, SampleReply
from actorrl.rollout.worker import RolloutWorker
from actorrl.runtime import Runtime


def weights_of(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """Plain ``{policy_id: weights}`` from either that or a learner's
    ``{"version": v, "weights": ...}`` payload."""
    if "weights" in payload and "version" in payload:
        return payload["weights"]
    return payload


class RolloutWorkerActor:
    """Remote rollout worker; constructor arguments as :class:`RolloutWorker` (the config
    arrives typed, a :class:`WorkerConfig`; a mapping is loaded strictly)."""

    def __init__(self, env: str, policy: str, config: WorkerConfig | Mapping[str, Any],
                 worker_index: int = 0, num_workers: int = 0, seed: int | None = None,
                 record_video: bool = False) -> None:
        self.worker = RolloutWorker(env, policy, config, worker_index=worker_index,
                                    num_workers=num_workers, seed=seed,
                                    record_video=record_video)
        self.worker_index = worker_index
        self.weights_version = -1

    def pop_videos(self) -> list[tuple[str, bytes]]:
        """The episode videos recorded since the last call (``record_video``): ``(file
        name, mp4 bytes)`` each; see :meth:`RolloutWorker.pop_videos`."""
        return self.worker.pop_videos()

    def sample(self) -> SampleBatch | MultiAgentBatch:
        """One sample batch (returned by value, or kept here when passed on as a ref)."""
        return self.worker.sample()

    def sample_ref(self) -> SampleReply:
        """Sample and keep the batch here; the reply carries its ref and counts."""
        batch = self.worker.sample()
        agent_steps = batch.agent_steps() if isinstance(batch, MultiAgentBatch) else batch.count
        return SampleReply(batch=Runtime.current().put(batch), count=batch.count,
                           agent_steps=agent_steps, worker_index=self.worker_index)

    def sample_with_count(self) -> tuple[SampleBatch | MultiAgentBatch, int]:
        """``(batch, env_steps)``."""
        return self.worker.sample_with_count()

    def compute_gradients(self, batch: SampleBatch | MultiAgentBatch) -> tuple[Any, dict]:
        """Gradients of the loss on ``batch`` and info with ``batch_count``."""
        return self.worker.compute_gradients(batch)

    def compute_gradients_ref(self, batch: SampleBatch | MultiAgentBatch) -> GradientsReply:
        """Gradients on ``batch`` kept here (the reply carries their ref and the info, with
        ``batch_count``), so whoever applies them fetches them from this worker."""
        grads, info = self.worker.compute_gradients(batch)
        return GradientsReply(grads=Runtime.current().put(grads), info=info)

    def sample_and_compute_gradients(self) -> tuple[Any, dict]:
        """``compute_gradients(sample())`` in one call; the sample never leaves."""
        return self.worker.compute_gradients(self.worker.sample())

    def apply_gradients(self, grads: Any) -> None:
        """Apply gradients to the local policies."""
        self.worker.apply_gradients(grads)

    def learn_on_batch(self, batch: SampleBatch | MultiAgentBatch) -> dict[str, Any]:
        """One update per trainable policy."""
        return self.worker.learn_on_batch(batch)

    def get_weights(self) -> dict[str, Any]:
        """``{policy_id: {name: array}}``."""
        return self.worker.get_weights()

    def set_weights(self, payload: Mapping[str, Any], global_timestep: int | None = None
                    ) -> int:
        """Load weights (plain or a learner payload with a version); returns the version."""
        self.worker.set_weights(weights_of(payload), global_timestep)
        self.weights_version = int(payload.get("version", self.weights_version + 1))
        return self.weights_version

    def set_global_timestep(self, timestep: int) -> None:
        """Schedules (epsilon, lr) follow the global env-step count."""
        self.worker.set_global_timestep(timestep)

    def get_metrics(self) -> EpisodeMetrics:
        """Episodes finished since the last call."""
        return self.worker.get_metrics()

    def pop_custom_metrics(self) -> list[dict[str, float]]:
        """Callbacks' ``custom_metrics`` of the episodes ended since the last call."""
        return self.worker.pop_custom_metrics()

    def get_filters(self, flush_after: bool = False) -> dict[str, Any]:
        """Observation-filter deltas since the last flush (see RolloutWorker)."""
        return self.worker.get_filters(flush_after)

    def sync_filters(self, new_filters: Mapping[str, Any]) -> None:
        """Take the driver's merged observation-filter statistics."""
        self.worker.sync_filters(new_filters)

    def filter_state(self) -> dict[str, Any] | None:
        """The observation filter's total statistics (None without one)."""
        return self.worker.filter_state()

    def get_state(self) -> dict[str, Any]:
        """Policy states for checkpoints."""
        return self.worker.get_state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore policy states."""
        self.worker.set_state(state)

    def sample_count(self) -> int:
        """Sample once and keep nothing but the metrics (evaluation); returns env steps."""
        return self.worker.sample().count

    def sample_for(self, seconds: float) -> int:
        """Throughput probe: sample in a loop for ``seconds`` with nothing around it
        (batches are dropped); returns the env steps taken."""
        deadline = time.perf_counter() + seconds
        steps = 0
        while time.perf_counter() < deadline:
            steps += self.worker.sample().count
        return steps

    def ping(self) -> int:
        """Liveness check; returns the worker index."""
        return self.worker_index

    def stop(self) -> None:
        """Close the envs."""
        self.worker.stop()
