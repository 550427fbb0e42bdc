"""SAC's policy settings (torch-free: :class:`~actorrl.algorithms.sac.SACConfig` composes
them), with RLlib's key names and defaults.

RLlib's SAC has three learning rates under ``optimization`` and two network configs:
``q_model_config`` and ``policy_model_config`` (RLlib 1.x: ``Q_model`` and
``policy_model``, read as aliases of these), each a small ``model``-style mapping of
``fcnet_hiddens`` and ``fcnet_activation``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from actorrl.config.sections import WORKER, ConfigSection, checked, derived
from actorrl.policy.config import PolicyConfig

SAC_NET_DEFAULTS: dict[str, Any] = {
    "fcnet_hiddens": [256, 256],
    "fcnet_activation": "relu",
    "post_fcnet_hiddens": [],
    "post_fcnet_activation": None,
    "custom_model": None,
    "custom_model_config": {},
}
"""RLlib's defaults of ``q_model_config`` and ``policy_model_config`` (both the same)."""

NET_ALIASES: dict[str, str] = {"hidden_activation": "fcnet_activation",
                               "hidden_layer_sizes": "fcnet_hiddens"}
"""RLlib 0.8-1.0's names of the two settings (its atari-sac file still writes them)."""

ACTIVATIONS = ("relu", "tanh", "elu", "swish", "linear")
"""The ``fcnet_activation`` values SAC's networks accept (``None`` is ``linear``)."""


def resolve_net_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """``config`` over :data:`SAC_NET_DEFAULTS` (RLlib updates its defaults with the
    given keys), RLlib 0.8's :data:`NET_ALIASES` read as the keys they name."""
    given = {NET_ALIASES.get(key, key): value for key, value in (config or {}).items()}
    return {**SAC_NET_DEFAULTS, **given}


def check_net_config(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with a ``q_model_config`` / ``policy_model_config`` mapping as
    ``(key, problem)``: unknown keys, bad layer sizes or activations, and the RLlib options
    actorrl's SAC does not build (a custom model, post-fcnet layers)."""
    problems: list[tuple[str, str]] = []
    for key in config:
        if key not in SAC_NET_DEFAULTS and key not in NET_ALIASES:
            problems.append((str(key), "unknown option of SAC's networks (supported: "
                                       f"{', '.join(sorted(SAC_NET_DEFAULTS))}; RLlib 0.8: "
                                       f"{', '.join(NET_ALIASES)})"))
    for old, new in NET_ALIASES.items():
        if old in config and new in config and config[old] != config[new]:
            problems.append((old, f"and {new} both set, to {config[old]!r} and "
                                  f"{config[new]!r}: keep one"))
    if problems:
        return problems
    resolved = resolve_net_config(config)
    hiddens = resolved["fcnet_hiddens"]
    if not isinstance(hiddens, (list, tuple)) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hiddens):
        problems.append(("fcnet_hiddens", f"must be a list of positive layer sizes, got "
                                          f"{hiddens!r}"))
    activation = resolved["fcnet_activation"]
    if activation is not None and activation not in ACTIVATIONS:
        problems.append(("fcnet_activation", f"must be one of {', '.join(ACTIVATIONS)}, got "
                                             f"{activation!r}"))
    if resolved["post_fcnet_hiddens"]:
        problems.append(("post_fcnet_hiddens", "post-fcnet layers are not built by actorrl's "
                                               "SAC: put the layers in fcnet_hiddens"))
    if resolved["custom_model"] is not None:
        problems.append(("custom_model", "custom SAC networks are not supported by actorrl; "
                                         "set fcnet_hiddens and fcnet_activation"))
    return problems


@dataclass(frozen=True, kw_only=True)
class SACOptimizationConfig(ConfigSection):
    """RLlib's ``optimization`` mapping: one Adam learning rate per loss."""

    actor_learning_rate: float = 3e-4
    """Learning rate of the policy (actor) network."""
    critic_learning_rate: float = 3e-4
    """Learning rate of the Q network(s)."""
    entropy_learning_rate: float = 3e-4
    """Learning rate of ``log(alpha)``, the entropy temperature."""

    def validate(self) -> list[str]:
        """Every learning rate > 0."""
        return [f"optimization.{name} must be > 0, got {getattr(self, name)!r}"
                for name in ("actor_learning_rate", "critic_learning_rate",
                             "entropy_learning_rate") if not getattr(self, name) > 0]


def check_sac_exploration(explore: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with SAC's ``exploration_config`` as ``(key, problem)``: only RLlib's
    ``StochasticSampling`` with an integer ``random_timesteps >= 0``."""
    problems: list[tuple[str, str]] = []
    kind = explore.get("type", "StochasticSampling")
    if kind != "StochasticSampling":
        problems.append(("type", f"{kind!r} cannot be honoured: SAC explores by sampling its "
                                 "action distribution (StochasticSampling)"))
    for key in explore:
        if key not in ("type", "random_timesteps"):
            problems.append((str(key), "unknown option of StochasticSampling (supported: "
                                       "type, random_timesteps)"))
    steps = explore.get("random_timesteps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        problems.append(("random_timesteps", f"must be an integer >= 0, got {steps!r}"))
    return problems


@dataclass(frozen=True, kw_only=True)
class SACPolicyConfig(PolicyConfig):
    """The settings of ``actorrl.policy.sac.SACPolicy`` (RLlib's SAC defaults). ``lr`` and
    ``model`` are not read: SAC's rates are ``optimization``'s, its networks
    ``q_model_config`` and ``policy_model_config`` (``model`` only sets the conv stack of
    image observations)."""

    grad_clip: float | None = None
    """Clip each network's gradient norm (actor, each Q network, alpha separately, as RLlib
    clips per optimizer); ``None`` (RLlib's default) disables it."""
    twin_q: bool = True
    """Two Q networks (each with a target); targets and the actor use their minimum."""
    q_model_config: dict[str, Any] = checked(dict, check_net_config)
    """The Q network(s): ``fcnet_hiddens`` (default [256, 256]) and ``fcnet_activation``
    (relu) over the observation concatenated with the action (continuous actions), or one
    Q-value per action (discrete). RLlib 1.x key: ``Q_model``."""
    policy_model_config: dict[str, Any] = checked(dict, check_net_config)
    """The policy network, as ``q_model_config`` (RLlib 1.x key: ``policy_model``): the
    mean and log-std of a tanh-squashed Gaussian (``Box``), or logits (``Discrete``)."""
    tau: float = 5e-3
    """Soft target update: ``target <- tau * online + (1 - tau) * target``."""
    initial_alpha: float = 1.0
    """Initial entropy temperature alpha (``log(alpha)`` is learned)."""
    target_entropy: float | str | None = "auto"
    """Entropy the temperature steers toward; ``auto``: ``-action_dim`` for ``Box``
    actions, ``0.98 * log(n)`` for ``Discrete(n)`` (RLlib's rules)."""
    n_step: int = 1
    """n-step returns (built per sampled fragment; a fragment shorter than ``n_step`` gives
    shorter returns, discounted by the steps they span)."""
    target_network_update_freq: int = 0
    """Env steps sampled between two soft target updates (0: after every update); the
    algorithm hands it to the learner in trained rows."""
    optimization: SACOptimizationConfig = field(default_factory=SACOptimizationConfig)
    """The actor, critic and entropy learning rates."""
    actor_lr: float | None = None
    """RLlib 2.10+'s key for ``optimization.actor_learning_rate``: replaces it when set."""
    critic_lr: float | None = None
    """RLlib 2.10+'s key for ``optimization.critic_learning_rate``: replaces it when set."""
    alpha_lr: float | None = None
    """RLlib 2.10+'s key for ``optimization.entropy_learning_rate``: replaces it when set."""
    no_done_at_end: bool = False
    """RLlib 1.x: never mark an episode's end terminal, so every transition bootstraps
    (SAC's Pendulum file sets it; with false, terminations stop the bootstrap and time
    limits do not)."""
    exploration_config: dict[str, Any] = checked(dict, check_sac_exploration)
    """RLlib's ``StochasticSampling``: actions sampled from the policy's distribution;
    with ``random_timesteps: N`` uniformly random actions for a worker's first N env
    steps (the whole ``Box``, or every ``Discrete`` action alike)."""
    train_batch_size: int = derived(256, "train_batch_size")
    """Rows per update (counts the rows of gradients applied from elsewhere)."""
    normalize_actions: bool = derived(True, "rollout.normalize_actions")
    """Whether the sampler maps ``Box`` actions from [-1, 1] onto the space's bounds (SAC's
    squashed Gaussian needs it)."""
    seed: int | None = derived(None, "seed")
    """Seed of the action-sampling RNG (offset by ``worker_index``)."""
    num_workers: int = derived(0, "num_workers")
    """Number of rollout workers."""
    worker_index: int = derived(0, WORKER)
    """0 for the learner, 1..num_workers for rollout workers."""

    def validate(self) -> list[str]:
        """Ranges of every setting; ``target_entropy`` a number, ``auto`` or null."""
        problems = super().validate()
        checks = [
            ("tau", 0.0 < self.tau <= 1.0, "in (0, 1]"),
            ("initial_alpha", self.initial_alpha > 0, "> 0"),
            ("n_step", self.n_step >= 1, ">= 1"),
            ("target_network_update_freq", self.target_network_update_freq >= 0, ">= 0"),
            ("train_batch_size", self.train_batch_size >= 1, ">= 1"),
            *[(name, getattr(self, name) is None or getattr(self, name) > 0, "> 0 or null")
              for name in ("actor_lr", "critic_lr", "alpha_lr")],
        ]
        problems += [f"{name} must be {allowed}, got {getattr(self, name)!r}"
                     for name, ok, allowed in checks if not ok]
        entropy = self.target_entropy
        if isinstance(entropy, str) and entropy != "auto" or \
                isinstance(entropy, float) and not math.isfinite(entropy):
            problems.append(f"target_entropy must be a number, 'auto' or null, got "
                            f"{entropy!r}")
        if self.lr_schedule:
            problems.append("lr_schedule is not read by SAC: its learning rates are "
                            "optimization.actor_learning_rate, critic_learning_rate and "
                            "entropy_learning_rate")
        if self.model.get("use_lstm") or self.model.get("use_attention"):
            problems.append("model.use_lstm: actorrl's SAC has no recurrent networks "
                            "(RLlib's is RNNSAC); set use_lstm: false")
        return problems

    @property
    def learning_rates(self) -> tuple[float, float, float]:
        """The actor, critic and entropy learning rates: ``optimization``'s, each replaced
        by ``actor_lr`` / ``critic_lr`` / ``alpha_lr`` where set."""
        opt = self.optimization
        return (opt.actor_learning_rate if self.actor_lr is None else self.actor_lr,
                opt.critic_learning_rate if self.critic_lr is None else self.critic_lr,
                opt.entropy_learning_rate if self.alpha_lr is None else self.alpha_lr)

    @property
    def random_timesteps(self) -> int:
        """Env steps of uniformly random actions before sampling the policy."""
        return int(self.exploration_config.get("random_timesteps", 0))

    @property
    def q_net(self) -> dict[str, Any]:
        """``q_model_config`` over RLlib's defaults."""
        return resolve_net_config(self.q_model_config)

    @property
    def policy_net(self) -> dict[str, Any]:
        """``policy_model_config`` over RLlib's defaults."""
        return resolve_net_config(self.policy_model_config)


__all__ = ["SACOptimizationConfig", "SACPolicyConfig", "SAC_NET_DEFAULTS",
           "check_net_config", "resolve_net_config"]
