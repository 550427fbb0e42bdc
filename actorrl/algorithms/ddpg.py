"""DDPG and TD3: RLlib's deterministic actor-critics on DQN's replay pipeline (``actorrl
train ddpg|td3``, ``run: DDPG|TD3``).

As RLlib builds DDPG on its DQN (SimpleQ), actorrl runs both on DQN's pipeline
(:mod:`actorrl.algorithms.dqn`): one replay shard (prioritized for DDPG, uniform for TD3),
weights synced to the sampler after every sample, sampling paced at the training
intensity (RLlib's natural ratio by default: one train batch per sampling round), and
``target_network_update_freq`` counted in env steps sampled, handed to the learner in rows
trained; the learner is paced too, as SAC's, so the replay ratio is exact. The policy
is :class:`actorrl.policy.ddpg.DDPGPolicy`; its keys are RLlib's
(``twin_q``, ``policy_delay``, ``smooth_target_policy``, ``target_noise``,
``target_noise_clip``, ``actor_hiddens``, ``critic_hiddens``, ``actor_lr``,
``critic_lr``, ``tau``, ``l2_reg``, ``use_huber``, ``exploration_config``...).

What differs from RLlib:

* ``num_workers: 0`` runs one rollout worker process (as SAC; a warning says so once).
* The actor acts in [-1, 1] (``tanh``) and the workers map its actions onto the Box's
  bounds (``normalize_actions``). The exploration noise and TD3's target smoothing are in
  that space: ``GaussianNoise``'s ``stddev`` and ``target_noise`` are fractions of half
  the action range (RLlib adds them in env units, so on Pendulum's [-2, 2] actorrl's
  noise is twice RLlib's relative to the range; Ornstein-Uhlenbeck noise, scaled by the
  range, is the same).
* ``use_state_preprocessor`` is not built: the networks read the flattened observation
  (a conv stack of ``model`` for images), each its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actorrl.algorithms.dqn import DQNConfig, DQNRolloutConfig
from actorrl.algorithms.sac import build_pipeline as build_paced_pipeline
from actorrl.algorithms.sac import settle_sampling
from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.policy.ddpg_config import DDPGPolicyConfig, TD3PolicyConfig
from actorrl.replay.config import ReplayConfig


@dataclass(frozen=True, kw_only=True)
class DDPGRolloutConfig(DQNRolloutConfig):
    """DDPG's rollout section: one env step per fragment (RLlib's DDPG); ``"auto"`` is
    ``n_step``."""

    rollout_fragment_length: int | str = 1  # type: ignore[assignment]
    """Env steps per env per ``sample()``, or ``"auto"`` (``n_step``)."""


def _ddpg_replay() -> ReplayConfig:
    """RLlib's DDPG replay: 50000 rows, prioritized, learning after 1500 env steps."""
    return ReplayConfig(buffer_size=50_000, learning_starts=1500, prioritized_replay=True)


def _td3_replay() -> ReplayConfig:
    """RLlib's TD3 replay: a million rows, uniform, learning after 10000 env steps."""
    return ReplayConfig(buffer_size=1_000_000, learning_starts=10_000,
                        prioritized_replay=False)


@dataclass(frozen=True, kw_only=True)
class DDPGConfig(DQNConfig):
    """DDPG settings with RLlib's DDPG defaults: 256-row batches of a 50000-row
    prioritized buffer replayed after 1500 env steps, 1-step fragments at the natural
    training intensity, [400, 300] relu actor and critic, learning rates 1e-3, targets
    soft-updated with tau 0.002 after every update, L2 1e-6, Ornstein-Uhlenbeck
    exploration after 1000 random steps, iterations of at least 1000 env steps."""

    num_workers: int = 1
    """Rollout worker processes; 0 (RLlib's local worker) runs one, with a warning."""
    train_batch_size: int = 256
    """Rows per replayed batch and SGD step."""
    timesteps_per_iteration: int = 1000
    """Minimum env steps sampled per iteration (RLlib's DDPG: 1000)."""
    min_iter_time_s: float = 0.0
    """Minimum wall time of one training iteration (RLlib's DDPG: none)."""
    rollout: DDPGRolloutConfig = field(default_factory=DDPGRolloutConfig)  # type: ignore[assignment]
    """How the rollout worker samples (``rollout_fragment_length`` may be ``auto``)."""
    policy: DDPGPolicyConfig = field(default_factory=DDPGPolicyConfig)  # type: ignore[assignment]
    """The DDPG policy (actor, Q networks, targets, exploration)."""
    replay: ReplayConfig = field(default_factory=_ddpg_replay)
    """The replay shard (``buffer_size``, ``prioritized_replay``, ``learning_starts``...)."""

    def __post_init__(self) -> None:
        settle_sampling(self, self.policy.n_step)
        super().__post_init__()

    def validate(self) -> list[str]:
        """DQN's checks with DDPG's limits: no batch replay, no multi-agent policy map."""
        problems = super().validate()
        if self.replay.batch_replay:
            problems.append("batch_replay is for recurrent Q-networks; DDPG replays "
                            "transitions: set batch_replay: false")
        if self.rollout.multiagent.get("policies"):
            problems.append("multiagent.policies: actorrl's DDPG trains one policy; drop "
                            "multiagent")
        return problems


@dataclass(frozen=True, kw_only=True)
class TD3Config(DDPGConfig):
    """TD3 settings: DDPG's with RLlib's TD3 defaults (twin Q, policy_delay 2, target
    smoothing, no L2, tau 0.005, 100-row batches of a 1M-row uniform buffer replayed after
    10000 env steps, Gaussian exploration of stddev 0.1 after 10000 random steps)."""

    train_batch_size: int = 100
    """Rows per replayed batch and SGD step."""
    policy: TD3PolicyConfig = field(default_factory=TD3PolicyConfig)  # type: ignore[assignment]
    """The TD3 policy."""
    replay: ReplayConfig = field(default_factory=_td3_replay)
    """The replay shard."""


async def build_pipeline(trainer: Trainer, config: DDPGConfig) -> AsyncReplayOptimizer:
    """SAC's pipeline: one replay shard next to the learner, sampling and learning both
    paced at the effective training intensity (RLlib's synchronous loop trains exactly
    that many rows per env step sampled)."""
    return await build_paced_pipeline(trainer, config)  # type: ignore[arg-type]


DDPG = AlgorithmSpec("ddpg", DDPGConfig, "actorrl.policy.ddpg:DDPGPolicy", build_pipeline)
TD3 = AlgorithmSpec("td3", TD3Config, "actorrl.policy.ddpg:TD3Policy", build_pipeline)

__all__ = ["DDPG", "DDPGConfig", "DDPGRolloutConfig", "TD3", "TD3Config"]
