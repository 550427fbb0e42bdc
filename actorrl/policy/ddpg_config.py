"""DDPG's, TD3's and Ape-X DDPG's policy settings (torch-free: the algorithm configs in
:mod:`actorrl.algorithms.ddpg` compose them), with RLlib's key names and defaults.

Exploration
    ``exploration_config`` is RLlib's mapping: ``OrnsteinUhlenbeckNoise`` (DDPG's default),
    ``GaussianNoise`` (TD3's) or their Ape-X forms ``PerWorkerOrnsteinUhlenbeckNoise`` /
    ``PerWorkerGaussianNoise``. It is merged as RLlib merges it: a mapping of the
    algorithm's type (or without ``type``) updates the algorithm's default mapping; a
    mapping of another type replaces it, its missing keys taking that type's own defaults.
    The loaded config holds the merged mapping, every key written out.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from actorrl.config.sections import WORKER, derived
from actorrl.policy.config import PolicyConfig

OU, GAUSSIAN = "OrnsteinUhlenbeckNoise", "GaussianNoise"
"""RLlib's two noise explorations."""
PER_WORKER = "PerWorker"
"""Prefix of their Ape-X forms: a fixed scale per worker instead of the schedule."""

_SCHEDULE = {"random_timesteps": 1000, "initial_scale": 1.0, "final_scale": 0.02,
             "scale_timesteps": 10000}
NOISE_DEFAULTS: dict[str, dict[str, Any]] = {
    OU: {"type": OU, **_SCHEDULE, "ou_base_scale": 0.1, "ou_theta": 0.15, "ou_sigma": 0.2},
    GAUSSIAN: {"type": GAUSSIAN, **_SCHEDULE, "stddev": 0.1},
}
NOISE_DEFAULTS.update({PER_WORKER + kind: {**values, "type": PER_WORKER + kind}
                       for kind, values in list(NOISE_DEFAULTS.items())})
"""Each exploration type's own defaults (RLlib's ``OrnsteinUhlenbeckNoise`` and
``GaussianNoise`` constructors)."""

ACTIVATIONS = ("relu", "tanh", "elu", "swish", "linear")
"""The hidden activations DDPG's networks accept."""


def merge_exploration(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` over ``defaults`` when it keeps their type (or names none), else over its
    own type's defaults (RLlib replaces the mapping when the type changes)."""
    kind = given.get("type", defaults["type"])
    base = defaults if kind == defaults["type"] else NOISE_DEFAULTS.get(kind, {})
    return {**base, **given}


def exploration_problems(explore: dict[str, Any]) -> list[str]:
    """Problems of a merged ``exploration_config``: its type, unknown keys (with close
    matches), and each value's range."""
    kind = explore.get("type")
    if kind not in NOISE_DEFAULTS:
        return [f"exploration_config.type: {kind!r} is not a DDPG exploration; use one of "
                f"{', '.join(NOISE_DEFAULTS)}"]
    known = list(NOISE_DEFAULTS[kind])
    problems = []
    for key in explore:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"unknown config key 'exploration_config.{key}' for {kind}{hint}")
    if problems:
        return problems
    for key, value in explore.items():
        if key == "type":
            continue
        integer = key in ("random_timesteps", "scale_timesteps")
        low = 1 if key == "scale_timesteps" else 0
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) \
                or value < low:
            kind_text = "an integer" if integer else "a number"
            problems.append(f"exploration_config.{key} must be {kind_text} >= {low}, got "
                            f"{value!r}")
    return problems


def _layers_problem(name: str, value: Any) -> list[str]:
    if all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in value):
        return []
    return [f"{name} must be a list of positive layer sizes, got {list(value)!r}"]


@dataclass(frozen=True, kw_only=True)
class DDPGPolicyConfig(PolicyConfig):
    """The settings of ``actorrl.policy.ddpg.DDPGPolicy`` (RLlib's DDPG defaults). ``lr``
    is not read: the rates are ``actor_lr`` and ``critic_lr``."""

    EXPLORATION: ClassVar[dict[str, Any]] = NOISE_DEFAULTS[OU]
    """The algorithm's ``exploration_config`` defaults (see the module docstring)."""

    grad_clip: float | None = None
    """Clip the actor's and the critic's gradient norms, each on its own (RLlib clips per
    optimizer); ``None`` (RLlib's default) disables it."""
    twin_q: bool = False
    """Two Q networks; the target is the minimum of their target values (TD3)."""
    policy_delay: int = 1
    """The actor steps on every ``policy_delay``-th update only (the first included)."""
    smooth_target_policy: bool = False
    """Add clipped Gaussian noise to the target policy's actions (TD3)."""
    target_noise: float = 0.2
    """Standard deviation of the target-smoothing noise (in the [-1, 1] action space)."""
    target_noise_clip: float = 0.5
    """The target-smoothing noise is clipped to [-target_noise_clip, target_noise_clip]."""
    actor_hiddens: tuple[int, ...] = (400, 300)
    """Hidden layers of the actor (a tanh output in [-1, 1] after them)."""
    actor_hidden_activation: str = "relu"
    """Activation of the actor's hidden layers."""
    critic_hiddens: tuple[int, ...] = (400, 300)
    """Hidden layers of each Q network over the observation and the action."""
    critic_hidden_activation: str = "relu"
    """Activation of the Q networks' hidden layers."""
    n_step: int = 1
    """n-step returns (built per sampled fragment)."""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the Q network(s)."""
    tau: float = 0.002
    """Soft target update: ``target <- tau * online + (1 - tau) * target`` (actor and Q
    networks)."""
    use_huber: bool = False
    """Huber critic loss (``huber_threshold``) instead of ``0.5 * td_error ** 2``."""
    huber_threshold: float = 1.0
    """Huber loss delta."""
    l2_reg: float = 1e-6
    """Weight of ``0.5 * sum(w ** 2)`` over each network's weights (not biases), added to
    the actor's and the critic's losses."""
    target_network_update_freq: int = 0
    """Env steps sampled between two soft target updates (0: after every update; Ape-X:
    rows trained); the algorithm hands it to the learner in trained rows."""
    exploration_config: dict[str, Any] = field(default_factory=dict)
    """RLlib's noise exploration (see the module docstring): ``type``,
    ``random_timesteps`` (uniform random actions until then), the scale schedule
    ``initial_scale`` -> ``final_scale`` over ``scale_timesteps`` after the random phase,
    ``ou_theta``/``ou_sigma``/``ou_base_scale`` (OU) or ``stddev`` (Gaussian)."""
    no_done_at_end: bool = False
    """RLlib 1.x: never mark an episode's end terminal, so every transition bootstraps."""
    train_batch_size: int = derived(256, "train_batch_size")
    """Rows per update (counts the rows of gradients applied from elsewhere)."""
    worker_side_prioritization: bool = derived(False, "replay.worker_side_prioritization")
    """Postprocessing stores initial priorities ``|td_error| + eps`` in ``weights``."""
    prioritized_replay_eps: float = derived(1e-6, "replay.prioritized_replay_eps")
    """Added to ``|td_error|`` to make priorities."""
    seed: int | None = derived(None, "seed")
    """Seed of the exploration RNG (offset by ``worker_index``)."""
    num_workers: int = derived(0, "num_workers")
    """Number of rollout workers (the per-worker exploration scales)."""
    worker_index: int = derived(0, WORKER)
    """0 for the learner, 1..num_workers for rollout workers."""

    def __post_init__(self) -> None:
        for name in ("actor_hiddens", "critic_hiddens"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "exploration_config",
                           merge_exploration(dict(self.EXPLORATION),
                                             dict(self.exploration_config)))
        super().__post_init__()

    def validate(self) -> list[str]:
        """Ranges of every setting, the layers and activations, the exploration."""
        problems = super().validate()
        checks = [
            ("policy_delay", self.policy_delay >= 1, ">= 1"),
            ("target_noise", self.target_noise >= 0, ">= 0"),
            ("target_noise_clip", self.target_noise_clip >= 0, ">= 0"),
            ("n_step", self.n_step >= 1, ">= 1"),
            ("actor_lr", self.actor_lr > 0, "> 0"),
            ("critic_lr", self.critic_lr > 0, "> 0"),
            ("tau", 0.0 < self.tau <= 1.0, "in (0, 1]"),
            ("huber_threshold", self.huber_threshold > 0, "> 0"),
            ("l2_reg", self.l2_reg >= 0, ">= 0"),
            ("target_network_update_freq", self.target_network_update_freq >= 0, ">= 0"),
            ("train_batch_size", self.train_batch_size >= 1, ">= 1"),
        ]
        problems += [f"{name} must be {allowed}, got {getattr(self, name)!r}"
                     for name, ok, allowed in checks if not ok]
        problems += _layers_problem("actor_hiddens", self.actor_hiddens)
        problems += _layers_problem("critic_hiddens", self.critic_hiddens)
        for name in ("actor_hidden_activation", "critic_hidden_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                problems.append(f"{name} must be one of {', '.join(ACTIVATIONS)}, got "
                                f"{getattr(self, name)!r}")
        problems += exploration_problems(self.exploration_config)
        if self.lr_schedule:
            problems.append("lr_schedule is not read by DDPG: its learning rates are "
                            "actor_lr and critic_lr")
        if self.model.get("use_lstm") or self.model.get("use_attention"):
            problems.append("model.use_lstm: actorrl's DDPG has no recurrent networks; set "
                            "use_lstm: false")
        return problems

    @property
    def per_worker(self) -> bool:
        """Whether the exploration scale is Ape-X's fixed per-worker one."""
        return str(self.exploration_config["type"]).startswith(PER_WORKER)


TD3_EXPLORATION: dict[str, Any] = {**NOISE_DEFAULTS[GAUSSIAN], "random_timesteps": 10000,
                                   "final_scale": 1.0, "scale_timesteps": 1}
"""TD3's exploration: Gaussian noise of stddev 0.1 at a constant scale of 1, after 10000
random steps."""


@dataclass(frozen=True, kw_only=True)
class TD3PolicyConfig(DDPGPolicyConfig):
    """DDPG's settings with RLlib's TD3 defaults: twin Q, the actor updated every second
    step, target smoothing, no L2 regularisation, tau 0.005, Gaussian exploration."""

    EXPLORATION: ClassVar[dict[str, Any]] = TD3_EXPLORATION
    """TD3's ``exploration_config`` defaults."""

    twin_q: bool = True
    """Two Q networks; the target is the minimum of their target values."""
    policy_delay: int = 2
    """The actor steps on every ``policy_delay``-th update only (the first included)."""
    smooth_target_policy: bool = True
    """Add clipped Gaussian noise to the target policy's actions."""
    l2_reg: float = 0.0
    """Weight of the L2 regularisation of the networks' weights."""
    tau: float = 5e-3
    """Soft target update rate."""
    train_batch_size: int = derived(100, "train_batch_size")
    """Rows per update."""


@dataclass(frozen=True, kw_only=True)
class ApexDDPGPolicyConfig(DDPGPolicyConfig):
    """DDPG's settings with RLlib's Ape-X DDPG defaults: 3-step returns, a fixed
    Ornstein-Uhlenbeck scale per worker."""

    EXPLORATION: ClassVar[dict[str, Any]] = NOISE_DEFAULTS[PER_WORKER + OU]
    """Ape-X DDPG's ``exploration_config`` defaults."""

    n_step: int = 3
    """n-step returns."""
    target_network_update_freq: int = 500_000
    """Rows trained between two target updates (Ape-X counts trained rows)."""
    train_batch_size: int = derived(512, "train_batch_size")
    """Rows per update."""


__all__ = ["ApexDDPGPolicyConfig", "DDPGPolicyConfig", "NOISE_DEFAULTS", "TD3PolicyConfig",
           "exploration_problems", "merge_exploration"]
