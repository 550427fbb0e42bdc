"""Ape-X DQN: distributed prioritized replay (RLlib's ``apex``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.algorithms.tuned import preset, tuned
from actorrl.config.algorithm import AlgorithmConfig
from actorrl.config.rollout import RolloutConfig
from actorrl.learner.config import LearnerConfig
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.policy.config import DQNPolicyConfig
from actorrl.replay.config import ReplayConfig
from actorrl.runtime import ActorHandle


@dataclass(frozen=True, kw_only=True)
class ApexConfig(AlgorithmConfig):
    """Ape-X settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine
    (``actorrl.algorithms.tuned``)."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("rollout", "policy", "replay", "learner")

    train_batch_size: int = tuned("apex", "train_batch_size")
    """Rows per replayed batch and SGD step."""
    rollout: RolloutConfig = field(default_factory=preset("apex", "rollout", RolloutConfig))
    """How the rollout workers sample."""
    policy: DQNPolicyConfig = field(default_factory=preset("apex", "policy", DQNPolicyConfig))
    """The DQN policy (double Q, dueling, n-step, target network, exploration)."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """The replay shards."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The learner process."""
    max_weight_sync_delay: int = 400
    """Env steps a worker samples between weight syncs."""
    debug: bool = False
    """Report extra pipeline stats (timing breakdown, pending tasks). Only the Ape-X
    pipeline has any; the other algorithms refuse the key."""
    training_intensity: float | None = tuned("apex", "training_intensity")
    """Rows trained per env step sampled: sampling pauses while the learner is behind
    (None: sample freely, as the original Ape-X; the learner then drops replays)."""

    def validate(self) -> list[str]:
        """Remote workers, a batch that splits across the towers, a positive weight-sync
        delay and training intensity, and batch replay for a recurrent Q-network."""
        problems = super().validate()
        if self.num_workers < 1:
            problems.append("Ape-X needs num_workers >= 1 (sampling runs on remote workers)")
        if self.max_weight_sync_delay < 1:
            problems.append(f"max_weight_sync_delay must be >= 1, got "
                            f"{self.max_weight_sync_delay}")
        towers = int(self.num_gpus) if self._fake_gpus else math.ceil(self.num_gpus)
        if self.num_gpus and self.train_batch_size % max(towers, 1):
            problems.append(f"train_batch_size ({self.train_batch_size}) must divide evenly "
                            f"across {towers} towers (num_gpus={self.num_gpus:g})")
        if self.training_intensity is not None and self.training_intensity <= 0:
            problems.append(f"training_intensity must be > 0 or None, got "
                            f"{self.training_intensity}")
        if self.policy.model.get("use_lstm") and not self.replay.batch_replay:
            problems.append(
                "model.use_lstm: a recurrent Q-network trains on whole sequences from their "
                "stored start states, which per-row replay cuts apart; set batch_replay: "
                "true and prioritized_replay: false (or use_lstm: false)")
        return problems

    def derived_values(self, section: str) -> dict[str, Any]:
        """The learner cuts no rows apart (towers split a recurrent Q-network's sequenced
        batches at sequence boundaries on their own) and waits for
        its first batch however long replay takes to reach ``learning_starts``. ``num_gpus``
        and ``_fake_gpus`` reach it as given: towers of the DQN loss on CUDA devices or,
        with ``_fake_gpus``, on the CPU (td_error comes back in row order either way)."""
        if section != "learner":
            return {}
        return {"tower_rows_multiple": 1, "wait_for_first_batch": True}


async def rows_kept(trainer: Trainer, shards: list[ActorHandle]) -> int:
    """Env steps already held by the replay shards a restarted trainer kept from the
    failed one (:meth:`Trainer.salvage`): they count towards ``learning_starts``, so
    learning resumes at once instead of waiting for that many new steps."""
    kept = [s for s in shards if s in trainer.reused]
    if not kept:
        return 0
    stats = await trainer.runtime.get_async([s.stats.remote() for s in kept], timeout_s=60)
    return sum(int(st.get("num_added", 0)) for st in stats)


async def build_pipeline(trainer: Trainer, config: ApexConfig, *, pace_learner: bool = False
                         ) -> AsyncReplayOptimizer:
    """Replay shards next to the learner, then the Ape-X pipeline (``pace_learner``: the
    learner held to ``training_intensity`` too, see :mod:`actorrl.pipelines.apex`)."""
    replay: ReplayConfig = config.component("replay")
    shard_class = ("actorrl.replay.actor:BatchReplayActor" if replay.batch_replay
                   else "actorrl.replay.actor:ReplayActor")
    shards = await trainer.create_learner_side_actors(
        shard_class, (replay,), replay.num_replay_buffer_shards, "replay")
    learning_starts = replay.learning_starts - await rows_kept(trainer, shards)
    return AsyncReplayOptimizer(
        trainer.runtime, trainer.workers, shards, trainer.learner_actor,
        learner_queue_size=config.learner.learner_queue_size,
        training_intensity=config.training_intensity,
        learning_starts=max(learning_starts, 0),
        max_weight_sync_delay=config.max_weight_sync_delay, debug=config.debug,
        replace_worker=trainer.replace_worker,
        replace_shard=trainer.replace_learner_side_actor, seed=config.seed,
        pace_learner_rows=config.train_batch_size if pace_learner else None)


APEX = AlgorithmSpec("apex", ApexConfig, "actorrl.policy.dqn:DQNPolicy", build_pipeline)
