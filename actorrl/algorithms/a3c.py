"""A3C: asynchronous advantage actor-critic (RLlib's ``a3c``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.config import AlgorithmConfig, RolloutConfig
from actorrl.learner.config import LearnerConfig
from actorrl.pipelines.a3c import AsyncGradientsOptimizer
from actorrl.policy.config import ActorCriticPolicyConfig


def _ac_rollout() -> RolloutConfig:
    return RolloutConfig(num_envs_per_worker=8, rollout_fragment_length=16)


def _ac_policy() -> ActorCriticPolicyConfig:
    return ActorCriticPolicyConfig(
        lr=3e-3, grad_clip=0.5, lambda_=0.95,
        model={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"})


@dataclass(frozen=True, kw_only=True)
class ActorCriticConfig(AlgorithmConfig):
    """Settings shared by A3C and A2C (actor-critic losses, GAE)."""

    rollout: RolloutConfig = field(default_factory=_ac_rollout)
    """How the rollout workers sample."""
    policy: ActorCriticPolicyConfig = field(default_factory=_ac_policy)
    """Actor-critic losses and GAE."""



@dataclass(frozen=True, kw_only=True)
class A3CConfig(ActorCriticConfig):
    """A3C settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine."""

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


async def build_pipeline(trainer: Trainer) -> AsyncGradientsOptimizer:
    """The A3C gradients pipeline."""
    config = trainer.config
    assert isinstance(config, A3CConfig) and trainer.learner is not None
    return AsyncGradientsOptimizer(trainer.runtime, trainer.workers, trainer.learner,
                                   grads_per_step=config.grads_per_step,
                                   replace_worker=trainer.replace_worker)


A3C = AlgorithmSpec(
    name="a3c",
    config_cls=A3CConfig,
    policy="actorrl.policy.actor_critic:ActorCriticPolicy",
    build_pipeline=build_pipeline,
    learner_config=learner_config,
    learner_thread=False,
)
