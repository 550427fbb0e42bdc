"""SAC: RLlib's Soft Actor-Critic on the replay pieces (``actorrl train sac``, ``run: SAC``).

As RLlib builds SAC on its DQN, actorrl runs it on DQN's pipeline (:mod:`actorrl.algorithms.
dqn`): one replay shard (uniform or prioritized), weights synced to the sampler after every
sample, sampling and learning both paced at the training intensity (RLlib's natural ratio
by default: one train batch per sampling round, 256 rows per env step with one 1-step
fragment; exact to within a slack of two samples' rows and one batch), and
``target_network_update_freq`` counted in env steps sampled, handed to the learner in rows
trained. The policy is :class:`actorrl.policy.sac.SACPolicy`; its keys are RLlib's
(``twin_q``, ``tau``, ``initial_alpha``, ``target_entropy``, ``optimization``,
``q_model_config``/``Q_model``, ``policy_model_config``/``policy_model``).

What differs from RLlib:

* ``num_workers: 0`` (RLlib samples on its local worker) runs one rollout worker process,
  which samples as RLlib's local worker does; a warning says so once. ``num_workers >= 1``
  samples on that many workers.
* n-step returns are built per sampled fragment, discounted by the steps each one spans:
  with ``rollout_fragment_length`` below ``n_step`` (RLlib 1.x's pendulum file: 1 and 3)
  the returns are shorter than ``n_step`` (RLlib 1.x discounted them by ``gamma ** n_step``
  all the same; RLlib 2.x refuses the pair). ``rollout_fragment_length: auto`` is
  ``n_step``, as RLlib 2.x.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

from actorrl.algorithms.apex import build_pipeline as build_apex_pipeline
from actorrl.algorithms.dqn import DQNConfig, DQNRolloutConfig
from actorrl.algorithms.ppo import AUTO, PPORolloutConfig
from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.config.aliases import RLlibKeyWarning
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.policy.sac_config import SACPolicyConfig
from actorrl.replay.config import ReplayConfig


class SamplerWarning(RLlibKeyWarning):
    """``num_workers: 0`` runs one rollout worker process (RLlib's local worker's job);
    shown as one line, as the other RLlib keys' warnings."""


@dataclass(frozen=True, kw_only=True)
class SACRolloutConfig(DQNRolloutConfig):
    """SAC's rollout section: one env step per fragment (RLlib's SAC); ``"auto"`` is
    ``n_step`` (RLlib 2.x)."""

    rollout_fragment_length: int | str = 1  # type: ignore[assignment]
    """Env steps per env per ``sample()``, or ``"auto"`` (``n_step``)."""


def _sac_replay() -> ReplayConfig:
    """RLlib's SAC replay: a million rows, prioritized (RLlib 2.x's
    ``MultiAgentPrioritizedReplayBuffer``), learning after 1500 env steps."""
    return ReplayConfig(buffer_size=1_000_000, learning_starts=1500, prioritized_replay=True)


def settle_sampling(config: DQNConfig, n_step: int) -> None:
    """What SAC's and DDPG's configs resolve before DQN's checks: ``rollout_fragment_length:
    auto`` is ``n_step`` (RLlib 2.x), and ``num_workers: 0`` runs one rollout worker process
    (RLlib's local worker's job), with one warning."""
    rollout = config.rollout
    if isinstance(rollout, PPORolloutConfig) and rollout.rollout_fragment_length == AUTO:
        object.__setattr__(config, "rollout", dataclasses.replace(
            rollout, rollout_fragment_length=n_step))
    if config.num_workers == 0:
        warnings.warn("num_workers: 0 runs one rollout worker process (num_workers: 1): "
                      "RLlib samples on its local worker, actorrl samples in a worker "
                      "process, which does the same", SamplerWarning, stacklevel=4)
        object.__setattr__(config, "num_workers", 1)


@dataclass(frozen=True, kw_only=True)
class SACConfig(DQNConfig):
    """SAC settings with RLlib's SAC defaults: 256-row batches of a 1M-row prioritized
    buffer replayed after 1500 env steps, 1-step fragments at the natural training
    intensity, twin Q networks of [256, 256] relu units soft-updated with tau 0.005 after
    every update, alpha learned from 1.0 toward the ``auto`` target entropy, learning rates
    3e-4, no gradient clip, iterations of at least 100 env steps."""

    num_workers: int = 1
    """Rollout worker processes; 0 (RLlib's local worker) runs one, with a warning."""
    train_batch_size: int = 256
    """Rows per replayed batch and SGD step."""
    timesteps_per_iteration: int = 100
    """Minimum env steps sampled per iteration (RLlib's SAC: 100)."""
    min_iter_time_s: float = 1.0
    """Minimum wall time of one training iteration (RLlib's SAC: 1 s)."""
    rollout: SACRolloutConfig = field(default_factory=SACRolloutConfig)  # type: ignore[assignment]
    """How the rollout worker samples (``rollout_fragment_length`` may be ``auto``)."""
    policy: SACPolicyConfig = field(default_factory=SACPolicyConfig)  # type: ignore[assignment]
    """The SAC policy (twin Q, targets, temperature, squashed Gaussian)."""
    replay: ReplayConfig = field(default_factory=_sac_replay)
    """The replay shard (``buffer_size``, ``prioritized_replay``, ``learning_starts``...)."""

    def __post_init__(self) -> None:
        settle_sampling(self, self.policy.n_step)
        super().__post_init__()

    def validate(self) -> list[str]:
        """DQN's checks with SAC's limits: no worker-side prioritization, no batch
        replay, no multi-agent policy map."""
        problems = super().validate()
        if self.replay.worker_side_prioritization:
            problems.append("worker_side_prioritization is not implemented for SAC: its "
                            "workers do not compute TD errors; set it to false")
        if self.replay.batch_replay:
            problems.append("batch_replay is for recurrent Q-networks; SAC replays "
                            "transitions: set batch_replay: false")
        if self.rollout.multiagent.get("policies"):
            problems.append("multiagent.policies: actorrl's SAC trains one policy; drop "
                            "multiagent")
        return problems


async def build_pipeline(trainer: Trainer, config: SACConfig) -> AsyncReplayOptimizer:
    """DQN's pipeline (one replay shard next to the learner) with sampling and learning
    both paced at the effective training intensity: RLlib's synchronous loop trains
    exactly that many rows per env step sampled."""
    return await build_apex_pipeline(trainer, config.replace(
        training_intensity=config.effective_training_intensity()), pace_learner=True)


SAC = AlgorithmSpec("sac", SACConfig, "actorrl.policy.sac:SACPolicy", build_pipeline)

__all__ = ["SAC", "SACConfig", "SACRolloutConfig", "SamplerWarning"]
