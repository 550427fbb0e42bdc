"""A3C: asynchronous advantage actor-critic (RLlib's ``a3c``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.config import AlgorithmConfig
from actorrl.pipelines.a3c import AsyncGradientsOptimizer


def _ac_model() -> dict[str, Any]:
    return {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}


@dataclass(frozen=True, kw_only=True)
class ActorCriticConfig(AlgorithmConfig):
    """Settings shared by A3C and A2C (actor-critic losses, GAE)."""

    num_envs_per_worker: int = 8
    rollout_fragment_length: int = 16
    lr: float = 3e-3
    grad_clip: float | None = 0.5
    model: dict[str, Any] = field(default_factory=_ac_model)
    use_gae: bool = True
    """Generalized advantage estimation (False: discounted returns minus the baseline)."""
    use_critic: bool = True
    """Learn a value baseline (False: plain policy gradient)."""
    vf_loss_coeff: float = 0.5
    """Weight of the value loss."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus."""
    lambda_: float = 0.95
    """GAE lambda (config key ``lambda``; a Python keyword, hence the field name)."""

    def validate(self) -> list[str]:
        problems = super().validate()
        if self.vf_loss_coeff < 0:
            problems.append(f"vf_loss_coeff must be >= 0, got {self.vf_loss_coeff}")
        if self.num_workers < 1:
            problems.append(f"{type(self).__name__} needs num_workers >= 1 (sampling runs on "
                            "remote workers)")
        if not 0 <= self.lambda_ <= 1:
            problems.append(f"lambda must be in [0, 1], got {self.lambda_}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["lambda"] = out.pop("lambda_")
        return out


@dataclass(frozen=True, kw_only=True)
class A3CConfig(ActorCriticConfig):
    """A3C settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine."""

    grads_per_step: int = 100
    """Gradients applied per pipeline step."""
    min_iter_time_s: float = 2.0

    def validate(self) -> list[str]:
        problems = super().validate()
        if self.grads_per_step < 1:
            problems.append(f"grads_per_step must be >= 1, got {self.grads_per_step}")
        return problems


def learner_config(config: AlgorithmConfig) -> dict[str, Any]:
    """A3C and A2C learners only apply gradients they are handed."""
    return {"train_batch_size": config.train_batch_size}


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
