"""A2C with synchronous microbatch gradient accumulation (RLlib's ``a2c`` with
``microbatch_size``)."""

from __future__ import annotations

from dataclasses import dataclass

from actorrl.algorithms.a3c import ACTOR_CRITIC_POLICY, ActorCriticConfig, learner_config
from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.algorithms.tuned import tuned
from actorrl.pipelines.microbatch import MicrobatchOptimizer


@dataclass(frozen=True, kw_only=True)
class A2CConfig(ActorCriticConfig):
    """A2C settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine
    (``actorrl.algorithms.tuned``)."""

    train_batch_size: int = tuned("a2c", "train_batch_size")
    """Rows per applied update (gradients of microbatches accumulate to it)."""
    microbatch_size: int | None = tuned("a2c", "microbatch_size")
    """Env steps per gradient computation; gradients accumulate to ``train_batch_size``.
    None (RLlib's default), or a size of at least ``train_batch_size``: one gradient of
    the whole train batch (plain A2C)."""

    def validate(self) -> list[str]:
        """microbatch_size >= 1 (or None). ``num_workers: 0`` samples with the learner's
        local worker (as the seeds' microbatch optimizer does)."""
        problems = super().validate()
        if self.microbatch_size is not None and self.microbatch_size < 1:
            problems.append(f"microbatch_size must be >= 1 or null, got "
                            f"{self.microbatch_size}")
        return problems

    def effective_microbatch_size(self) -> int:
        """The rows per gradient: ``microbatch_size``, at most ``train_batch_size``."""
        if self.microbatch_size is None:
            return self.train_batch_size
        return min(self.microbatch_size, self.train_batch_size)


def build_pipeline(trainer: Trainer, config: A2CConfig) -> MicrobatchOptimizer:
    """The microbatch pipeline."""
    return MicrobatchOptimizer(trainer.runtime, trainer.workers, trainer.learner_actor,
                               train_batch_size=config.train_batch_size,
                               microbatch_size=config.effective_microbatch_size(),
                               sample_locally=config.num_workers == 0,
                               replace_worker=trainer.replace_worker)


A2C = AlgorithmSpec("a2c", A2CConfig, ACTOR_CRITIC_POLICY, build_pipeline, learner_config,
                    learner_thread=False)
