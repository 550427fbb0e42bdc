"""PPO: proximal policy optimization with synchronous sampling and minibatch SGD epochs
(RLlib's ``PPO``, old API stack, torch).

The component defaults are RLlib's PPOConfig (``PPOPolicyConfig``, ``PPOLearnerConfig``,
``rollout_fragment_length: auto``, ``train_batch_size`` 4000 in RLlib); what the
algorithm's own defaults change, tuned for CartPole-v1 on 2 cores, is
``actorrl.algorithms.tuned.CARTPOLE_TUNED["ppo"]``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from actorrl.algorithms.trainer import AlgorithmSpec, Trainer
from actorrl.algorithms.tuned import preset, tuned
from actorrl.config.algorithm import AlgorithmConfig
from actorrl.config.rollout import RolloutConfig
from actorrl.config.sections import ConfigError
from actorrl.learner.config import PPOLearnerConfig
from actorrl.pipelines.ppo import SyncSamplesOptimizer
from actorrl.policy.config import PPOPolicyConfig

PPO_POLICY = "actorrl.policy.ppo:PPOPolicy"
"""The policy of PPO."""

AUTO = "auto"
"""``rollout_fragment_length: auto``: train_batch_size / (workers x envs per worker)."""


@dataclass(frozen=True, kw_only=True)
class PPORolloutConfig(RolloutConfig):
    """PPO's rollout section: as :class:`~actorrl.config.rollout.RolloutConfig`, except that
    ``rollout_fragment_length`` may be ``"auto"`` (RLlib's PPO default), which
    :class:`PPOConfig` resolves to ``ceil(train_batch_size / (max(num_workers, 1) *
    num_envs_per_worker))`` when it is built (so configs saved with a run, and
    checkpoints, hold the number)."""

    rollout_fragment_length: int | str = AUTO  # type: ignore[assignment]
    """Env steps per env per ``sample()``, or ``"auto"`` (see the class docstring)."""

    def validate(self) -> list[str]:
        """RolloutConfig's checks; ``"auto"`` is the one string accepted."""
        fragment = self.rollout_fragment_length
        if isinstance(fragment, str):
            if fragment != AUTO:
                return [f"rollout_fragment_length must be an int >= 1 or 'auto', got "
                        f"{fragment!r}"]
            try:
                self.resolved(1)
            except ConfigError as exc:
                return list(exc.problems) or [str(exc)]
            return []
        return super().validate()

    def resolved(self, fragment: int) -> RolloutConfig:
        """A plain :class:`RolloutConfig` (what workers receive) with these values and
        ``rollout_fragment_length`` = ``fragment`` where it is ``"auto"``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(RolloutConfig)}
        if values["rollout_fragment_length"] == AUTO:
            values["rollout_fragment_length"] = fragment
        return RolloutConfig(**values)


@dataclass(frozen=True, kw_only=True)
class PPOConfig(AlgorithmConfig):
    """PPO settings; the defaults are tuned to solve CartPole-v1 on a 2-core machine
    (``actorrl.algorithms.tuned``), the sections' own defaults are RLlib's."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("rollout", "policy", "learner")

    min_iter_time_s: float = 0.0
    """Minimum wall time of one training iteration: none, so each iteration is one train
    step, as RLlib's PPO reports."""
    train_batch_size: int = tuned("ppo", "train_batch_size")
    """Env steps sampled (with the same weights) per train step; the learner runs
    ``num_sgd_iter`` epochs of minibatch SGD on them."""
    rollout: PPORolloutConfig = field(
        default_factory=preset("ppo", "rollout", PPORolloutConfig))
    """How the rollout workers sample (``rollout_fragment_length`` may be ``auto``)."""
    policy: PPOPolicyConfig = field(default_factory=preset("ppo", "policy", PPOPolicyConfig))
    """The PPO losses, GAE and the adaptive KL coefficient."""
    learner: PPOLearnerConfig = field(
        default_factory=preset("ppo", "learner", PPOLearnerConfig))
    """Minibatch SGD epochs (``num_sgd_iter``, ``sgd_minibatch_size``,
    ``shuffle_sequences``) and towers."""

    def __post_init__(self) -> None:
        rollout = self.rollout
        if isinstance(rollout, PPORolloutConfig) and rollout.rollout_fragment_length == AUTO:
            object.__setattr__(self, "rollout", dataclasses.replace(
                rollout, rollout_fragment_length=self.auto_fragment_length()))
        super().__post_init__()

    def auto_fragment_length(self) -> int:
        """RLlib's ``auto`` fragment: the train batch spread over every env of every
        worker (the learner's local worker with ``num_workers: 0``), rounded up."""
        envs = max(self.num_workers, 1) * max(self.rollout.num_envs_per_worker, 1)
        return max(1, math.ceil(self.train_batch_size / envs))

    def validate(self) -> list[str]:
        """Fragments that tile the train batch (within 10%, as RLlib checks), episodes
        that can be truncated (a critic to bootstrap from)."""
        problems = super().validate()
        rollout = self.rollout
        fragment = rollout.rollout_fragment_length
        if isinstance(fragment, int) and fragment >= 1 and self.train_batch_size > 0:
            per_round = fragment * max(self.num_workers, 1) * rollout.num_envs_per_worker
            rounds = math.ceil(self.train_batch_size / per_round)
            if rollout.batch_mode == "truncate_episodes" and \
                    rounds * per_round - self.train_batch_size > 0.1 * self.train_batch_size:
                suggested = math.ceil(self.train_batch_size / (
                    max(self.num_workers, 1) * rollout.num_envs_per_worker))
                problems.append(
                    f"train_batch_size ({self.train_batch_size}) is not tiled by rollout "
                    f"fragments: each sampling round brings {per_round} env steps "
                    f"(rollout_fragment_length {fragment} x {max(self.num_workers, 1)} "
                    f"worker(s) x {rollout.num_envs_per_worker} env(s)), so a train batch "
                    f"would hold {rounds * per_round}, more than 10% over; set "
                    f"rollout_fragment_length to 'auto' or {suggested}, or train_batch_size "
                    f"to a multiple of {per_round}")
        minibatch = self.learner.sgd_minibatch_size
        towers = int(self.num_gpus) if self._fake_gpus else math.ceil(self.num_gpus)
        if minibatch > self.train_batch_size:
            problems.append(f"sgd_minibatch_size ({minibatch}) must be <= "
                            f"train_batch_size ({self.train_batch_size})")
        elif towers > 1 and self.train_batch_size % towers:
            below = self.train_batch_size - self.train_batch_size % towers
            problems.append(f"train_batch_size ({self.train_batch_size}) must divide evenly "
                            f"across the learner's {towers} towers (num_gpus={self.num_gpus:g}):"
                            f" set train_batch_size to a multiple of {towers} (e.g. {below} or "
                            f"{below + towers})")
        elif minibatch < max(towers, 1):
            problems.append(f"sgd_minibatch_size ({minibatch}) must be at least the number "
                            f"of towers ({towers}): each tower learns on a share of every "
                            "minibatch")
        if rollout.batch_mode == "truncate_episodes" and not self.policy.use_critic:
            problems.append("batch_mode 'truncate_episodes' needs use_critic=True (a value "
                            "function to bootstrap truncated fragments from); set "
                            "batch_mode to 'complete_episodes' or use_critic to true")
        return problems

    def replace(self, **changes: Any) -> PPOConfig:  # type: ignore[override]
        """A copy with ``changes`` applied (as :meth:`AlgorithmConfig.replace`); a fragment
        length that is this config's ``auto`` value stays ``auto`` (it follows a new
        ``train_batch_size``, ``num_workers`` or ``num_envs_per_worker``) unless
        ``changes`` set it."""
        section = changes.get("rollout")
        given = "rollout_fragment_length" in changes or (
            isinstance(section, dict) and "rollout_fragment_length" in section)
        if not given and self.rollout.rollout_fragment_length == self.auto_fragment_length():
            changes["rollout_fragment_length"] = AUTO
        return super().replace(**changes)

    def derived_values(self, section: str) -> dict[str, Any]:
        """The learner splits minibatches anywhere between rows (recurrent ones between
        sequences: it reads ``seq_lens``) and has its whole train batch in hand when it
        starts: no learner-thread wait applies."""
        if section == "learner":
            return {"tower_rows_multiple": 1, "wait_for_first_batch": False}
        return {}

    def component(self, section: str) -> Any:
        """As :meth:`AlgorithmConfig.component`; the rollout section goes out as a plain
        :class:`RolloutConfig` (with its fragment length resolved)."""
        built = super().component(section)
        if isinstance(built, PPORolloutConfig):
            return built.resolved(self.auto_fragment_length())
        return built


def build_pipeline(trainer: Trainer, config: PPOConfig) -> SyncSamplesOptimizer:
    """The synchronous PPO pipeline."""
    return SyncSamplesOptimizer(trainer.runtime, trainer.workers, trainer.learner_actor,
                                train_batch_size=config.train_batch_size,
                                sample_locally=config.num_workers == 0,
                                replace_worker=trainer.replace_worker)


PPO = AlgorithmSpec("ppo", PPOConfig, PPO_POLICY, build_pipeline, learner_thread=False)
