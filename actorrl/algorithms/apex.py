"""Ape-X DQN: distributed prioritized replay (RLlib's ``apex``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.config import AlgorithmConfig
from actorrl.pipelines.apex import AsyncReplayOptimizer


def _apex_model() -> dict[str, Any]:
    return {"fcnet_hiddens": [64], "fcnet_activation": "relu"}


def _apex_exploration() -> dict[str, Any]:
    return {"type": "EpsilonGreedy", "initial_epsilon": 1.0,
            "final_epsilon": 0.02, "epsilon_timesteps": 10000}


@dataclass(frozen=True, kw_only=True)
class ApexConfig(AlgorithmConfig):
    """Ape-X settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine."""

    num_workers: int = 2
    num_envs_per_worker: int = 4
    rollout_fragment_length: int = 8
    train_batch_size: int = 64
    lr: float = 1e-3
    grad_clip: float | None = 40.0
    model: dict[str, Any] = field(default_factory=_apex_model)
    buffer_size: int = 50_000
    """Replay capacity in rows, split across the shards."""
    learning_starts: int = 1000
    """Env steps sampled before replay starts (split across the shards)."""
    prioritized_replay: bool = True
    """Proportional prioritized replay (False: uniform)."""
    prioritized_replay_alpha: float = 0.6
    """Priority exponent."""
    prioritized_replay_beta: float = 0.4
    """Importance-weight exponent."""
    prioritized_replay_eps: float = 1e-6
    """Added to ``|td_error|`` for priorities."""
    num_replay_buffer_shards: int = 1
    """Replay shard actors."""
    max_weight_sync_delay: int = 400
    """Env steps a worker samples between weight syncs."""
    batch_replay: bool = False
    """Replay whole sample batches (recurrent models); no prioritization."""
    n_step: int = 3
    """n-step returns."""
    double_q: bool = True
    """Double Q-learning targets."""
    dueling: bool = True
    """Dueling value/advantage heads."""
    hiddens: list[int] = field(default_factory=lambda: [64])
    """Hidden layers of the Q heads."""
    huber_threshold: float = 1.0
    """Huber loss delta."""
    adam_epsilon: float = 1e-8
    """Adam epsilon."""
    target_network_update_freq: int = 4000
    """Trained rows between target-network syncs."""
    exploration_config: dict[str, Any] = field(default_factory=_apex_exploration)
    """Epsilon-greedy settings (PerWorkerEpsilonGreedy: Ape-X's fixed per-worker eps)."""
    per_worker_exploration: bool = False
    """Worker i of N explores with eps = 0.4 ** (1 + 7 (i-1)/(N-1)) (the Ape-X paper's
    scheme; off in the CartPole defaults, where 2 workers would leave one at eps 0.4 and
    the reported mean return far below what the policy achieves)."""
    worker_side_prioritization: bool = False
    """Workers compute initial priorities before sending samples."""
    learner_queue_size: int = 16
    """Bound of the learner's in-queue of replayed batches (drops beyond it)."""
    learner_queue_timeout: float = 300.0
    """Seconds without replayed data before the learner fails."""
    training_intensity: float | None = 8.0
    """Rows trained per env step sampled: sampling pauses while the learner is behind
    (None: sample freely, as the original Ape-X; the learner then drops replays)."""

    def validate(self) -> list[str]:
        problems = super().validate()
        if self.num_workers < 1:
            problems.append("Ape-X needs num_workers >= 1 (sampling runs on remote workers)")
        if self.num_replay_buffer_shards < 1:
            problems.append(f"num_replay_buffer_shards must be >= 1, got "
                            f"{self.num_replay_buffer_shards}")
        elif self.buffer_size < self.num_replay_buffer_shards:
            problems.append(f"buffer_size ({self.buffer_size}) must be at least "
                            f"num_replay_buffer_shards ({self.num_replay_buffer_shards})")
        if self.learning_starts < 0:
            problems.append(f"learning_starts must be >= 0, got {self.learning_starts}")
        if self.prioritized_replay_alpha < 0:
            problems.append(f"prioritized_replay_alpha must be >= 0, got "
                            f"{self.prioritized_replay_alpha}")
        if self.prioritized_replay_beta < 0:
            problems.append(f"prioritized_replay_beta must be >= 0, got "
                            f"{self.prioritized_replay_beta}")
        if self.max_weight_sync_delay < 1:
            problems.append(f"max_weight_sync_delay must be >= 1, got "
                            f"{self.max_weight_sync_delay}")
        if self.training_intensity is not None and self.training_intensity <= 0:
            problems.append(f"training_intensity must be > 0 or None, got "
                            f"{self.training_intensity}")
        for key in ("n_step", "target_network_update_freq", "learner_queue_size"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)}")
        return problems


def learner_config(config: ApexConfig) -> dict[str, Any]:
    """Ape-X learns with the plain learner thread, one pass per replayed batch."""
    return {"train_batch_size": config.train_batch_size, "num_gpus": 0.0
            if config._fake_gpus else config.num_gpus, "learner_queue_size":
            config.learner_queue_size, "learner_queue_timeout": config.learner_queue_timeout}


async def build_pipeline(trainer: Trainer) -> AsyncReplayOptimizer:
    """Replay shards next to the learner, then the Ape-X pipeline."""
    config = trainer.config
    assert isinstance(config, ApexConfig) and trainer.learner is not None
    shard_class = ("actorrl.replay.actor:BatchReplayActor" if config.batch_replay
                   else "actorrl.replay.actor:ReplayActor")
    shards = await trainer.create_learner_side_actors(
        shard_class,
        (config.num_replay_buffer_shards, config.learning_starts, config.buffer_size,
         config.train_batch_size, config.prioritized_replay_alpha,
         config.prioritized_replay_beta, config.prioritized_replay_eps,
         config.prioritized_replay),
        config.num_replay_buffer_shards, "replay",
        kwargs={"worker_side_prioritization": config.worker_side_prioritization})
    return AsyncReplayOptimizer(
        trainer.runtime, trainer.workers, shards, trainer.learner,
        learner_queue_size=config.learner_queue_size,
        training_intensity=config.training_intensity,
        learning_starts=config.learning_starts,
        max_weight_sync_delay=config.max_weight_sync_delay, debug=config.debug,
        replace_worker=trainer.replace_worker,
        replace_shard=trainer.replace_learner_side_actor, seed=config.seed)


APEX = AlgorithmSpec(
    name="apex",
    config_cls=ApexConfig,
    policy="actorrl.policy.dqn:DQNPolicy",
    build_pipeline=build_pipeline,
    learner_config=learner_config,
)
