"""DQN: RLlib's (non-distributed) ``dqn`` on the Ape-X pieces.

One replay buffer (a single replay shard), one sampler, weights synced to it after every
sample, an ``EpsilonGreedy`` schedule (no per-worker epsilons) and no worker-side
prioritization: the Ape-X pipeline (:mod:`actorrl.pipelines.apex`) run with RLlib 2.x's
``DQNConfig`` defaults. What differs from RLlib:

* sampling runs on remote rollout workers: the default ``num_workers`` is 1 (one sampler
  process does what RLlib's local worker does with its ``num_workers: 0``), and
  ``num_workers: 0`` is refused with that advice;
* ``target_network_update_freq`` counts env steps sampled, as RLlib's DQN does (Ape-X
  counts rows trained): the learner gets it in trained rows at the training intensity;
* ``training_intensity: null`` is RLlib's natural ratio, made explicit: one train batch per
  sampling round, ``train_batch_size / (rollout_fragment_length x num_envs_per_worker x
  num_workers)`` rows trained per env step sampled (8 with the defaults). The pipeline
  pauses sampling while the learner is behind that ratio, as RLlib's synchronous loop
  alternates one sampling round and one train step.

The tuned CartPole values (``actorrl train dqn --env CartPole-v1``) are
``actorrl.algorithms.tuned.CARTPOLE_TUNED["dqn"]``: they leave RLlib's DQN defaults as
they are and set only what RLlib leaves to the model catalog.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from actorrl.algorithms.apex import ApexConfig
from actorrl.algorithms.apex import build_pipeline as build_apex_pipeline
from actorrl.algorithms.ppo import AUTO, PPORolloutConfig
from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.algorithms.tuned import preset
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.policy.config import DQNPolicyConfig

DQN_AUTO_FRAGMENT = 4
"""What RLlib 2.x's DQN samples per env per round with ``rollout_fragment_length: auto``
(its 2.0-2.4 default was 4; "auto" keeps 4 here)."""


@dataclass(frozen=True, kw_only=True)
class DQNRolloutConfig(PPORolloutConfig):
    """DQN's rollout section: ``rollout_fragment_length`` is 4 (RLlib's DQN) and may be
    given as ``"auto"``, which :class:`DQNConfig` resolves to 4 when it is built."""

    rollout_fragment_length: int | str = DQN_AUTO_FRAGMENT  # type: ignore[assignment]
    """Env steps per env per ``sample()``, or ``"auto"`` (4, RLlib's DQN)."""


def _dqn_rollout() -> DQNRolloutConfig:
    return preset("dqn", "rollout", DQNRolloutConfig)()


@dataclass(frozen=True, kw_only=True)
class DQNConfig(ApexConfig):
    """DQN settings: Ape-X's keys with RLlib 2.x's ``DQNConfig`` defaults (lr 5e-4, 32-row
    batches, 4-step fragments, target network synced every 500 trained rows, a 50000-row
    prioritized buffer (alpha 0.6, beta 0.4, eps 1e-6) replaying after 1000 steps, 1-step
    double dueling Q with a 256-unit head, epsilon 1.0 -> 0.02 over 10000 steps); one
    replay shard, weights synced after every sample."""

    num_workers: int = 1
    """Rollout worker processes (RLlib's DQN samples on its local worker with 0; actorrl
    samples on remote workers: 1 does the same)."""
    train_batch_size: int = 32
    """Rows per replayed batch and SGD step."""
    rollout: DQNRolloutConfig = field(default_factory=_dqn_rollout)
    """How the rollout worker samples (``rollout_fragment_length`` may be ``auto``)."""
    policy: DQNPolicyConfig = field(default_factory=preset("dqn", "policy", DQNPolicyConfig))
    """The DQN policy (double Q, dueling, n-step, target network, epsilon schedule)."""
    max_weight_sync_delay: int = 1
    """Env steps a worker samples between weight syncs (1: after every sample, as RLlib's
    DQN syncs its workers after every train step)."""
    training_intensity: float | None = None
    """Rows trained per env step sampled (None: RLlib's natural ratio, one train batch per
    sampling round; see :meth:`effective_training_intensity`)."""

    def __post_init__(self) -> None:
        rollout = self.rollout
        if isinstance(rollout, PPORolloutConfig) and rollout.rollout_fragment_length == AUTO:
            object.__setattr__(self, "rollout", dataclasses.replace(
                rollout, rollout_fragment_length=DQN_AUTO_FRAGMENT))
        super().__post_init__()

    def validate(self) -> list[str]:
        """Ape-X's checks, with DQN's advice for ``num_workers: 0``."""
        problems = super().validate()
        if self.num_workers < 1:
            problems = [p for p in problems if not p.startswith("Ape-X needs num_workers")]
            problems.append(
                f"DQN needs num_workers >= 1, got {self.num_workers}: actorrl samples on "
                "remote rollout workers, and num_workers: 1 does what RLlib's num_workers: "
                "0 (sampling on the local worker) does")
        return problems

    def effective_training_intensity(self) -> float:
        """``training_intensity``, or RLlib's natural ratio when it is None: one train
        batch per sampling round of every worker's envs."""
        if self.training_intensity is not None:
            return self.training_intensity
        fragment = self.rollout.rollout_fragment_length
        assert isinstance(fragment, int)
        per_round = fragment * self.rollout.num_envs_per_worker * max(self.num_workers, 1)
        return self.train_batch_size / per_round

    def target_update_rows(self) -> int:
        """``target_network_update_freq`` as the learner counts it. RLlib's DQN counts env
        steps sampled between target syncs (Ape-X and actorrl's learner count rows
        trained): at the effective training intensity, ``freq`` sampled steps are ``freq x
        intensity`` trained rows (500 -> 4000 with the defaults)."""
        freq = self.policy.target_network_update_freq
        return max(1, round(freq * self.effective_training_intensity()))

    def derived_values(self, section: str) -> dict[str, Any]:
        """Ape-X's learner values; the policy gets ``target_network_update_freq`` in
        trained rows (:meth:`target_update_rows`)."""
        if section == "policy":
            return {"target_network_update_freq": self.target_update_rows()}
        return super().derived_values(section)

    def component(self, section: str) -> Any:
        """As :meth:`AlgorithmConfig.component`; the rollout section goes out as a plain
        :class:`~actorrl.config.rollout.RolloutConfig`."""
        built = super().component(section)
        if isinstance(built, PPORolloutConfig):
            return built.resolved(DQN_AUTO_FRAGMENT)
        return built


async def build_pipeline(trainer: Trainer, config: DQNConfig) -> AsyncReplayOptimizer:
    """The Ape-X pipeline (replay shards next to the learner), paced at the effective
    training intensity."""
    return await build_apex_pipeline(trainer, config.replace(
        training_intensity=config.effective_training_intensity()))


DQN = AlgorithmSpec("dqn", DQNConfig, "actorrl.policy.dqn:DQNPolicy", build_pipeline)

__all__ = ["DQN", "DQNConfig", "DQNRolloutConfig"]
