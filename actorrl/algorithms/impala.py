"""IMPALA: V-trace actor-critic fed by asynchronous samplers (RLlib's ``impala``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.algorithms.tuned import preset, tuned
from actorrl.config.algorithm import AlgorithmConfig
from actorrl.config.rollout import RolloutConfig
from actorrl.learner.config import LearnerConfig
from actorrl.pipelines.impala import AsyncSamplesOptimizer
from actorrl.policy.config import ImpalaPolicyConfig


@dataclass(frozen=True, kw_only=True)
class ImpalaConfig(AlgorithmConfig):
    """IMPALA settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine
    (``actorrl.algorithms.tuned``)."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("rollout", "policy", "learner")

    train_batch_size: int = tuned("impala", "train_batch_size")
    """Rows per SGD step (whole rollout fragments)."""
    rollout: RolloutConfig = field(default_factory=preset("impala", "rollout", RolloutConfig))
    """How the rollout workers sample."""
    policy: ImpalaPolicyConfig = field(
        default_factory=preset("impala", "policy", ImpalaPolicyConfig))
    """The V-trace actor-critic policy."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The learner process (towers, minibatch buffer, in-queue)."""
    max_sample_requests_in_flight_per_worker: int = 2
    """Sample calls kept in flight on each worker."""
    broadcast_interval: int = 1
    """Train batches between weight broadcasts to the workers."""

    def validate(self) -> list[str]:
        """Remote workers, truncated fragments that tile the train batch and the towers."""
        problems = super().validate()
        fragment = self.rollout.rollout_fragment_length
        if self.num_workers < 1:
            problems.append("IMPALA needs num_workers >= 1 (it samples asynchronously on "
                            "remote workers)")
        if self.rollout.batch_mode != "truncate_episodes":
            problems.append("IMPALA needs batch_mode='truncate_episodes' (fixed-length "
                            "sequences for V-trace)")
        if self.train_batch_size % fragment:
            problems.append(f"train_batch_size ({self.train_batch_size}) must be a multiple "
                            f"of rollout_fragment_length ({fragment})")
        towers = int(self.num_gpus) if self._fake_gpus else math.ceil(self.num_gpus)
        if self.num_gpus and self.train_batch_size % (towers * fragment):
            problems.append(
                f"train_batch_size ({self.train_batch_size}) must split into whole "
                f"{fragment}-step sequences across {towers} towers")
        for key in ("max_sample_requests_in_flight_per_worker", "broadcast_interval"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)!r}")
        return problems

    def derived_values(self, section: str) -> dict[str, Any]:
        """Each tower gets whole V-trace sequences; a learner starved from the start fails
        after ``learner_queue_timeout`` (the seeds' IMPALA learner, unlike Ape-X's)."""
        if section == "learner":
            return {"tower_rows_multiple": self.rollout.rollout_fragment_length,
                    "wait_for_first_batch": False}
        return {}


def build_pipeline(trainer: Trainer, config: ImpalaConfig) -> AsyncSamplesOptimizer:
    """The IMPALA sample pipeline over the trainer's workers and learner."""
    return AsyncSamplesOptimizer(
        trainer.runtime, trainer.workers, trainer.learner_actor,
        train_batch_size=config.train_batch_size,
        broadcast_interval=config.broadcast_interval,
        max_sample_requests_in_flight_per_worker=config.max_sample_requests_in_flight_per_worker,
        replace_worker=trainer.replace_worker)


IMPALA = AlgorithmSpec("impala", ImpalaConfig, "actorrl.policy.impala:ImpalaPolicy",
                       build_pipeline)
