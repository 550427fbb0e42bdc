"""APPO: IMPALA's asynchronous pipeline and learner with PPO's clipped surrogate (RLlib's
``appo``; the loss and the old-policy network are :mod:`actorrl.policy.appo`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorrl.algorithms.impala import ImpalaConfig
from actorrl.algorithms.impala import build_pipeline as build_impala_pipeline
from actorrl.algorithms.trainer import AlgorithmSpec
from actorrl.algorithms.tuned import preset, tuned
from actorrl.config.rollout import RolloutConfig
from actorrl.policy.config import APPOPolicyConfig


@dataclass(frozen=True, kw_only=True)
class APPOConfig(ImpalaConfig):
    """APPO settings: IMPALA's, with the APPO policy section; the defaults are tuned to
    solve CartPole-v1 on a 2-core machine (``actorrl.algorithms.tuned``)."""

    train_batch_size: int = tuned("appo", "train_batch_size")
    """Rows per SGD step (whole rollout fragments)."""
    rollout: RolloutConfig = field(default_factory=preset("appo", "rollout", RolloutConfig))
    """How the rollout workers sample."""
    policy: APPOPolicyConfig = field(
        default_factory=preset("appo", "policy", APPOPolicyConfig))
    """The clipped-surrogate actor-critic policy."""


APPO = AlgorithmSpec("appo", APPOConfig, "actorrl.policy.appo:APPOPolicy",
                     build_impala_pipeline)
