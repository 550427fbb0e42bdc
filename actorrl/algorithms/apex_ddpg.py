"""Ape-X DDPG: DDPG on the Ape-X pipeline (``run: APEX_DDPG``, ``actorrl train apex_ddpg``).

RLlib's ``ApexDDPG`` is DDPG's policy trained by Ape-X DQN's loop; so is actorrl's: the
Ape-X pipeline (:mod:`actorrl.pipelines.apex`: prioritized replay shards next to the
learner, samples sent straight from the workers to the shards, weights synced after
``max_weight_sync_delay`` env steps per worker, priorities from the learner's TD errors;
the learner paced at ``training_intensity`` rows per env step sampled, as RLlib's Ape-X
loop requests replay) with :class:`actorrl.policy.ddpg.ApexDDPGPolicy`. Each rollout
worker explores with a fixed noise scale, Ape-X DQN's per-worker epsilon ``0.4 ** (1 + 7
(i - 1) / (N - 1))`` (``PerWorkerOrnsteinUhlenbeckNoise``, RLlib's default, or
``PerWorkerGaussianNoise``), and with ``worker_side_prioritization`` (the default)
computes its rows' initial priorities from its own TD errors.
``target_network_update_freq`` counts rows trained (Ape-X's rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actorrl.algorithms.apex import ApexConfig
from actorrl.algorithms.apex import build_pipeline as build_apex_pipeline
from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.config.rollout import RolloutConfig
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.policy.ddpg_config import ApexDDPGPolicyConfig
from actorrl.replay.config import ReplayConfig


def _apex_ddpg_rollout() -> RolloutConfig:
    """RLlib's Ape-X DDPG fragments: 50 env steps."""
    return RolloutConfig(rollout_fragment_length=50)


def _apex_ddpg_replay() -> ReplayConfig:
    """RLlib's Ape-X DDPG replay: 2M rows over 4 prioritized shards, learning after 50000
    env steps, initial priorities computed by the workers."""
    return ReplayConfig(buffer_size=2_000_000, learning_starts=50_000,
                        prioritized_replay=True, num_replay_buffer_shards=4,
                        worker_side_prioritization=True)


@dataclass(frozen=True, kw_only=True)
class ApexDDPGConfig(ApexConfig):
    """Ape-X DDPG settings with RLlib's defaults: 32 workers sampling 50-step fragments,
    512-row batches from 4 prioritized shards (2M rows, replay after 50000 env steps,
    worker-side priorities), one row trained per env step sampled, weights synced every
    400 env steps per worker, 3-step returns, targets updated every 500000 rows trained,
    per-worker Ornstein-Uhlenbeck exploration, iterations of at least 25000 env steps and
    30 s."""

    num_workers: int = 32
    """Rollout worker processes."""
    train_batch_size: int = 512
    """Rows per replayed batch and SGD step."""
    timesteps_per_iteration: int = 25_000
    """Minimum env steps sampled per iteration."""
    min_iter_time_s: float = 30.0
    """Minimum wall time of one training iteration."""
    rollout: RolloutConfig = field(default_factory=_apex_ddpg_rollout)
    """How the rollout workers sample."""
    policy: ApexDDPGPolicyConfig = field(  # type: ignore[assignment]
        default_factory=ApexDDPGPolicyConfig)
    """The DDPG policy with per-worker exploration scales."""
    replay: ReplayConfig = field(default_factory=_apex_ddpg_replay)
    """The replay shards."""
    max_weight_sync_delay: int = 400
    """Env steps a worker samples between weight syncs."""
    training_intensity: float | None = 1.0
    """Rows trained per env step sampled (sampling pauses while the learner is behind)."""

    def validate(self) -> list[str]:
        """Ape-X's checks with DDPG's limits: no batch replay, one policy."""
        problems = super().validate()
        if self.replay.batch_replay:
            problems.append("batch_replay is for recurrent Q-networks; Ape-X DDPG replays "
                            "transitions: set batch_replay: false")
        if self.rollout.multiagent.get("policies"):
            problems.append("multiagent.policies: actorrl's Ape-X DDPG trains one policy; "
                            "drop multiagent")
        return problems


async def build_pipeline(trainer: Trainer, config: ApexDDPGConfig) -> AsyncReplayOptimizer:
    """The Ape-X pipeline with its learner paced as well: RLlib's Ape-X loop requests
    ``training_intensity`` batches of replay per ``train_batch_size`` env steps sampled,
    so the learner never runs ahead of the ratio."""
    return await build_apex_pipeline(trainer, config, pace_learner=True)


APEX_DDPG = AlgorithmSpec("apex_ddpg", ApexDDPGConfig, "actorrl.policy.ddpg:ApexDDPGPolicy",
                          build_pipeline)

__all__ = ["APEX_DDPG", "ApexDDPGConfig"]
