"""The rollout component's configs: :class:`RolloutConfig` (how a worker samples) and
:class:`WorkerConfig` (what a rollout worker is built from).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actorrl.config.sections import ConfigSection, derived

# ---- the rollout component ------------------------------------------------------------
BATCH_MODES = ("truncate_episodes", "complete_episodes")


MULTIAGENT_KEYS = ("policies", "policy_mapping_fn", "policies_to_train")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(ConfigSection):
    """How a rollout worker samples (``actorrl.rollout.RolloutWorker``)."""

    num_envs_per_worker: int = 1
    """Envs per worker, stepped together with one batched forward pass."""
    rollout_fragment_length: int = 200
    """Env steps per env per ``sample()`` (RLlib's sample_batch_size); RLlib 2.x's
    ``auto`` is train_batch_size over every worker's envs, rounded up (DQN: 4)."""
    batch_mode: str = "truncate_episodes"
    """``truncate_episodes`` or ``complete_episodes``."""
    explore: bool = True
    """Sample actions (False: the most likely actions)."""
    horizon: int | None = None
    """RLlib's hard horizon: single-agent episodes are cut (truncated, so values bootstrap)
    after this many steps, over any limit the env has (None: where the env ends them)."""
    normalize_actions: bool = True
    """The policy acts in [-1, 1] on a bounded float ``Box`` and its actions are mapped
    onto the space's bounds (then clipped) before ``env.step``; the batch keeps the
    sampled action (RLlib's default: true; see actorrl.data.actions)."""
    clip_actions: bool = False
    """Without ``normalize_actions``: clip ``Box`` actions to the space's bounds before
    ``env.step`` (RLlib's default: false)."""
    observation_filter: str = "NoFilter"
    """``NoFilter`` or ``MeanStdFilter``: observations normalised by running mean/std
    (clipped to [-10, 10]), kept per worker and merged by the driver every iteration
    (per policy in multi-agent envs; see actorrl.envs.filters)."""
    multiagent: dict[str, Any] = field(default_factory=dict)
    """``policies``, ``policy_mapping_fn``, ``policies_to_train`` (see actorrl.rollout)."""
    env_config: dict[str, Any] = derived(None, "env_config")
    """Passed to the env factory / ``gymnasium.make`` (the algorithm's ``env_config``)."""
    seed: int | None = derived(None, "seed")
    """Env i of worker w: seed + 1000 w + i; torch: seed + w (the algorithm's ``seed``)."""
    callbacks: str | None = derived(None, "callbacks")
    """The callbacks class whose episode and sample hooks the worker runs (the
    algorithm's ``callbacks``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_config", dict(self.env_config or {}))
        object.__setattr__(self, "multiagent", dict(self.multiagent or {}))
        super().__post_init__()

    def validate(self) -> list[str]:
        """Sizes >= 1, a known batch mode, known multiagent keys."""
        problems = []
        if self.batch_mode not in BATCH_MODES:
            problems.append(f"batch_mode must be 'truncate_episodes' or 'complete_episodes', "
                            f"got {self.batch_mode!r}")
        for key in ("rollout_fragment_length", "num_envs_per_worker"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be an int >= 1, got {getattr(self, key)!r}")
        if self.horizon is not None and self.horizon < 1:
            problems.append(f"horizon must be an int >= 1 or null, got {self.horizon!r}")
        from actorrl.envs.filters import check_observation_filter

        problems += check_observation_filter(self.observation_filter)
        unknown = sorted(set(self.multiagent) - set(MULTIAGENT_KEYS))
        if unknown:
            problems.append(f"unknown multiagent key(s) {unknown}; allowed: "
                            f"{list(MULTIAGENT_KEYS)}")
        return problems


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(ConfigSection):
    """What a rollout worker (and the learner's local worker) receives: how to sample and
    its policy's settings, derived values filled in."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling settings."""
    policy: ConfigSection
    """The policy class's config (``policy_cls.config_class``)."""
