"""IMPALA: V-trace actor-critic fed by asynchronous samplers (RLlib's ``impala``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.config import AlgorithmConfig
from actorrl.pipelines.impala import AsyncSamplesOptimizer


@dataclass(frozen=True, kw_only=True)
class ImpalaConfig(AlgorithmConfig):
    """IMPALA settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine."""

    num_workers: int = 2
    num_envs_per_worker: int = 8
    rollout_fragment_length: int = 50
    train_batch_size: int = 800
    lr: float = 5e-4
    grad_clip: float | None = 40.0
    min_iter_time_s: float = 2.0
    model: dict[str, Any] = None  # type: ignore[assignment]
    vtrace: bool = True
    """Use V-trace off-policy correction (False: plain actor-critic targets)."""
    vtrace_clip_rho_threshold: float = 1.0
    """Clip of the importance ratio in the value targets (rho-bar)."""
    vtrace_clip_pg_rho_threshold: float = 1.0
    """Clip of the importance ratio in the policy-gradient advantages."""
    vf_loss_coeff: float = 0.5
    """Weight of the value loss."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus."""
    opt_type: str = "adam"
    """``adam`` or ``rmsprop``."""
    decay: float = 0.99
    """RMSProp decay."""
    momentum: float = 0.0
    """RMSProp momentum."""
    epsilon: float = 0.1
    """RMSProp epsilon."""
    num_sgd_iter: int = 1
    """Passes over each train batch."""
    minibatch_buffer_size: int = 1
    """Slots of the learner's minibatch buffer."""
    learner_queue_size: int = 16
    """Bound of the learner's in-queue."""
    learner_queue_timeout: float = 300.0
    """Seconds without data before the learner fails."""
    num_multi_gpu_tower_stacks: int = 1
    """Pre-loaded batch stacks per device (multi-tower learner)."""
    num_data_load_threads: int = 1
    """Loader threads of the multi-tower learner."""
    max_sample_requests_in_flight_per_worker: int = 2
    """Sample calls kept in flight on each worker."""
    broadcast_interval: int = 1
    """Train batches between weight broadcasts to the workers."""

    def __post_init__(self) -> None:
        if self.model is None:
            object.__setattr__(self, "model", {"fcnet_hiddens": [64, 64],
                                               "fcnet_activation": "tanh"})
        super().__post_init__()

    def validate(self) -> list[str]:
        problems = super().validate()
        if self.num_workers < 1:
            problems.append("IMPALA needs num_workers >= 1 (it samples asynchronously on "
                            "remote workers)")
        if self.opt_type not in ("adam", "rmsprop"):
            problems.append(f"opt_type must be 'adam' or 'rmsprop', got {self.opt_type!r}")
        if self.batch_mode != "truncate_episodes":
            problems.append("IMPALA needs batch_mode='truncate_episodes' (fixed-length "
                            "sequences for V-trace)")
        if self.train_batch_size % self.rollout_fragment_length:
            problems.append(f"train_batch_size ({self.train_batch_size}) must be a multiple "
                            f"of rollout_fragment_length ({self.rollout_fragment_length})")
        towers = int(self.num_gpus) if self._fake_gpus else math.ceil(self.num_gpus)
        if self.num_gpus and self.train_batch_size % (towers * self.rollout_fragment_length):
            problems.append(
                f"train_batch_size ({self.train_batch_size}) must split into whole "
                f"{self.rollout_fragment_length}-step sequences across {towers} towers")
        for key in ("vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold"):
            if getattr(self, key) <= 0:
                problems.append(f"{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("num_sgd_iter", "minibatch_buffer_size", "learner_queue_size",
                    "num_multi_gpu_tower_stacks", "num_data_load_threads",
                    "max_sample_requests_in_flight_per_worker", "broadcast_interval"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)!r}")
        return problems


def learner_config(config: ImpalaConfig) -> dict[str, Any]:
    """The learner's settings for an IMPALA config."""
    return {
        "train_batch_size": config.train_batch_size,
        "num_gpus": config.num_gpus,
        "_fake_gpus": config._fake_gpus,
        "num_sgd_iter": config.num_sgd_iter,
        "minibatch_buffer_size": config.minibatch_buffer_size,
        "learner_queue_size": config.learner_queue_size,
        "learner_queue_timeout": config.learner_queue_timeout,
        "num_multi_gpu_tower_stacks": config.num_multi_gpu_tower_stacks,
        "num_data_load_threads": config.num_data_load_threads,
        "tower_rows_multiple": config.rollout_fragment_length,
    }


async def build_pipeline(trainer: Trainer) -> AsyncSamplesOptimizer:
    """The IMPALA sample pipeline over the trainer's workers and learner."""
    config = trainer.config
    assert isinstance(config, ImpalaConfig) and trainer.learner is not None
    return AsyncSamplesOptimizer(
        trainer.runtime, trainer.workers, trainer.learner,
        train_batch_size=config.train_batch_size,
        broadcast_interval=config.broadcast_interval,
        max_sample_requests_in_flight_per_worker=config.max_sample_requests_in_flight_per_worker,
        replace_worker=trainer.replace_worker)


IMPALA = AlgorithmSpec(
    name="impala",
    config_cls=ImpalaConfig,
    policy="actorrl.policy.impala:ImpalaPolicy",
    build_pipeline=build_pipeline,
    learner_config=learner_config,
)
