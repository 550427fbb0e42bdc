"""A3C: asynchronous advantage actor-critic (RLlib's ``a3c``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.algorithms.tuned import preset
from actorrl.config.algorithm import AlgorithmConfig
from actorrl.config.rollout import RolloutConfig
from actorrl.learner.config import LearnerConfig
from actorrl.pipelines.a3c import AsyncGradientsOptimizer
from actorrl.policy.config import ActorCriticPolicyConfig

ACTOR_CRITIC_POLICY = "actorrl.policy.actor_critic:ActorCriticPolicy"
"""The policy of A3C and A2C."""


@dataclass(frozen=True, kw_only=True)
class ActorCriticConfig(AlgorithmConfig):
    """Settings shared by A3C and A2C (actor-critic losses, GAE)."""

    rollout: RolloutConfig = field(default_factory=preset("a3c", "rollout", RolloutConfig))
    """How the rollout workers sample."""
    policy: ActorCriticPolicyConfig = field(
        default_factory=preset("a3c", "policy", ActorCriticPolicyConfig))
    """Actor-critic losses and GAE."""


@dataclass(frozen=True, kw_only=True)
class A3CConfig(ActorCriticConfig):
    """A3C settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine
    (``actorrl.algorithms.tuned``)."""

    grads_per_step: int = 100
    """Gradients applied per pipeline step."""

    def validate(self) -> list[str]:
        """Remote workers (they compute the gradients), grads_per_step >= 1."""
        problems = super().validate()
        if self.num_workers < 1:
            problems.append("A3C needs num_workers >= 1 (remote workers compute the "
                            "gradients; A2C can sample with num_workers=0)")
        if self.grads_per_step < 1:
            problems.append(f"grads_per_step must be >= 1, got {self.grads_per_step}")
        return problems


def learner_config(config: AlgorithmConfig) -> LearnerConfig:
    """A3C and A2C learners only apply gradients they are handed (no learner section)."""
    return LearnerConfig(train_batch_size=config.train_batch_size)


def build_pipeline(trainer: Trainer, config: A3CConfig) -> AsyncGradientsOptimizer:
    """The A3C gradients pipeline."""
    return AsyncGradientsOptimizer(trainer.runtime, trainer.workers, trainer.learner_actor,
                                   grads_per_step=config.grads_per_step,
                                   replace_worker=trainer.replace_worker)


A3C = AlgorithmSpec("a3c", A3CConfig, ACTOR_CRITIC_POLICY, build_pipeline, learner_config,
                    learner_thread=False)
