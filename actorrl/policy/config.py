"""The policies' config dataclasses (torch-free: an algorithm config composes them).

:class:`PolicyConfig` holds what every torch policy reads (``lr``, ``grad_clip``,
``gamma``, ``model``); each policy class names its subclass as ``config_class``. Fields
marked ``derived`` are filled by the algorithm from the one place that sets them (see
:mod:`actorrl.config.sections`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actorrl.config.sections import WORKER, ConfigSection, checked, derived
from actorrl.policy.schedules import check_schedule


def check_model(model: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with a ``model`` mapping as ``(key, problem)``: keys the model catalog
    (``actorrl.policy.model_config.resolve_model_config``) does not know, with suggestions."""
    import difflib

    from actorrl.policy.model_config import model_value_problems, resolve_model_config

    known = list(resolve_model_config({}))
    problems = []
    for key in model:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=2, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            problems.append((str(key), f"unknown model option{hint} (supported: "
                                       f"{', '.join(sorted(known))})"))
    if not problems:
        resolved = {**resolve_model_config({}), **model}
        problems.extend(model_value_problems(resolved))
        problems.extend(_custom_model_problems(resolved))
    return problems


def _custom_model_problems(model: dict[str, Any]) -> list[tuple[str, str]]:
    """``use_lstm`` with a custom model that lacks the recurrent interface. The class is
    looked at only when its module imports here (a job checked where the user's code is
    not installed is checked again when the policy builds its model)."""
    if not model["use_lstm"] or model["custom_model"] is None:
        return []
    from actorrl.util.classpath import resolve_callable

    try:
        cls = resolve_callable(model["custom_model"], "model.custom_model")
    except ValueError:
        return []
    from actorrl.policy.model_config import missing_recurrent_methods

    missing = missing_recurrent_methods(cls)
    if not missing:
        return []
    return [("use_lstm", f"custom_model {model['custom_model']!r} is not recurrent (it has "
                         f"no {', '.join(missing)}); implement actorrl.policy.models."
                         "RecurrentModel's interface or set use_lstm to false")]


@dataclass(frozen=True, kw_only=True)
class PolicyConfig(ConfigSection):
    """What every torch policy reads (``actorrl.policy.base.TorchPolicy``)."""

    lr: float = 5e-4
    """Learning rate (unless ``lr_schedule`` is set)."""
    lr_schedule: list[list[float]] | None = None
    """Learning rate over global env steps, RLlib's format: ``[[0, lr0], [t1, lr1], ...]``
    (starts at 0, linear between points, the last value after the last point); replaces
    ``lr``. The learner applies it; ``cur_lr`` in the learner stats reports it."""
    grad_clip: float | None = 40.0
    """Global gradient-norm clip; ``None`` disables it."""
    gamma: float = 0.99
    """Discount factor."""
    model: dict[str, Any] = checked(dict, check_model)
    """Model options (``actorrl.policy.model_config.MODEL_DEFAULTS``: ``fcnet_hiddens``,
    ``fcnet_activation``, ``conv_filters``, ``custom_model``...); validated at load time."""
    normalize_actions: bool = derived(False, WORKER)
    """Whether the workers unsquash this policy's Box actions from [-1, 1] (the rollout
    section's ``normalize_actions``, filled in by the rollout worker): Gaussian policies
    then bound their log standard deviations (actorrl.policy.action_dist)."""

    def validate(self) -> list[str]:
        """lr > 0, gamma in [0, 1], grad_clip > 0 or None."""
        problems = []
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if not 0.0 <= self.gamma <= 1.0:
            problems.append(f"gamma must be in [0, 1], got {self.gamma!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            problems.append(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")
        problems += check_schedule("lr_schedule", self.lr_schedule)
        return problems


# ---- DQN / Ape-X --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ExplorationConfig(ConfigSection):
    """Epsilon-greedy exploration (RLlib's ``exploration_config``)."""

    type: str = "EpsilonGreedy"
    """``EpsilonGreedy`` (linear schedule) or ``PerWorkerEpsilonGreedy`` (Ape-X epsilons)."""
    initial_epsilon: float = 1.0
    """Epsilon at global timestep 0."""
    final_epsilon: float = 0.02
    """Epsilon from ``epsilon_timesteps`` on."""
    epsilon_timesteps: int = 10000
    """Env steps over which epsilon falls linearly from initial to final."""

    def validate(self) -> list[str]:
        """A known type, epsilons in [0, 1], epsilon_timesteps >= 1."""
        problems = []
        if self.type not in ("EpsilonGreedy", "PerWorkerEpsilonGreedy"):
            problems.append("exploration_config.type must be 'EpsilonGreedy' or "
                            f"'PerWorkerEpsilonGreedy', got {self.type!r}")
        for name in ("initial_epsilon", "final_epsilon"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                problems.append(f"exploration_config.{name} must be in [0, 1], got {value}")
        if self.epsilon_timesteps < 1:
            problems.append(f"exploration_config.epsilon_timesteps must be >= 1, got "
                            f"{self.epsilon_timesteps}")
        return problems


@dataclass(frozen=True, kw_only=True)
class DQNPolicyConfig(PolicyConfig):
    """The settings of ``actorrl.policy.dqn.DQNPolicy`` (RLlib's DQN defaults)."""

    adam_epsilon: float = 1e-8
    """Adam epsilon."""
    n_step: int = 1
    """Length of the n-step returns built in ``postprocess_trajectory``."""
    double_q: bool = True
    """Pick the next action with the online net and evaluate it with the target net."""
    dueling: bool = True
    """Separate value and advantage streams, Q = V + A - mean(A)."""
    hiddens: tuple[int, ...] = (256,)
    """Hidden layers of each head (advantage, and value when dueling), after the trunk."""
    huber_threshold: float = 1.0
    """Huber loss delta: quadratic below, linear above."""
    target_network_update_freq: int = 500
    """Trained rows between two target-network syncs."""
    exploration_config: ExplorationConfig = field(default_factory=ExplorationConfig)
    """Epsilon-greedy schedule."""
    per_worker_exploration: bool = False
    """Ape-X: worker i of N uses eps = 0.4 ** (1 + 7 (i-1)/(N-1)); worker 0 acts greedily."""
    train_batch_size: int = derived(32, "train_batch_size")
    """Rows per update; counts the rows of gradients applied from elsewhere."""
    worker_side_prioritization: bool = derived(False, "replay.worker_side_prioritization")
    """Postprocessing stores initial priorities ``|td_error| + eps`` in ``weights``."""
    prioritized_replay_eps: float = derived(1e-6, "replay.prioritized_replay_eps")
    """Added to ``|td_error|`` to make priorities."""
    seed: int | None = derived(None, "seed")
    """Seed of the exploration RNG (offset by ``worker_index``)."""
    num_workers: int = derived(0, "num_workers")
    """Number of rollout workers."""
    worker_index: int = derived(0, WORKER)
    """0 for the learner / local worker, 1..num_workers for rollout workers."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hiddens", tuple(int(h) for h in self.hiddens))
        if isinstance(self.exploration_config, dict):
            object.__setattr__(self, "exploration_config",
                               ExplorationConfig.load(self.exploration_config,
                                                      path="exploration_config."))
        super().__post_init__()

    def validate(self) -> list[str]:
        """Ranges of every numeric setting. (``model.use_lstm`` builds a recurrent
        Q-network; Ape-X accepts it with ``batch_replay`` only, see ``ApexConfig``.)"""
        problems = super().validate()
        checks = [
            ("n_step", self.n_step >= 1, ">= 1"),
            ("huber_threshold", self.huber_threshold > 0, "> 0"),
            ("target_network_update_freq", self.target_network_update_freq >= 1, ">= 1"),
            ("train_batch_size", self.train_batch_size >= 1, ">= 1"),
            ("worker_index", self.worker_index >= 0, ">= 0"),
            ("num_workers", self.num_workers >= 0, ">= 0"),
            ("prioritized_replay_eps", self.prioritized_replay_eps >= 0, ">= 0"),
        ]
        problems += [f"{name} must be {allowed}, got {getattr(self, name)!r}"
                     for name, ok, allowed in checks if not ok]
        if any(h < 1 for h in self.hiddens):
            problems.append(f"hiddens must be positive layer sizes, got {list(self.hiddens)}")
        if self.per_worker_exploration and self.worker_index > max(self.num_workers, 1):
            problems.append(
                f"worker_index must be <= num_workers ({self.num_workers}) with "
                f"per_worker_exploration, got {self.worker_index}")
        return problems

    @property
    def per_worker(self) -> bool:
        """Whether Ape-X per-worker epsilons are in use."""
        return (self.per_worker_exploration
                or self.exploration_config.type == "PerWorkerEpsilonGreedy")


# ---- IMPALA -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ImpalaPolicyConfig(PolicyConfig):
    """The settings of ``actorrl.policy.impala.ImpalaPolicy``."""

    vtrace: bool = True
    """V-trace off-policy correction (False: importance ratios taken as 1, i.e. plain
    n-step actor-critic targets on the behaviour data)."""
    vtrace_clip_rho_threshold: float | None = 1.0
    """rho-bar: clip of the importance weights in the value targets (None: no clip)."""
    vtrace_clip_pg_rho_threshold: float | None = 1.0
    """Clip of the importance weights in the policy-gradient advantages (None: no clip)."""
    vf_loss_coeff: float = 0.5
    """Weight of the value loss."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus (unless ``entropy_coeff_schedule`` is set)."""
    entropy_coeff_schedule: list[list[float]] | None = None
    """Entropy weight over global env steps, as ``lr_schedule``; replaces
    ``entropy_coeff``, whose current value the learner stats report."""
    opt_type: str = "adam"
    """``adam`` or ``rmsprop``."""
    decay: float = 0.99
    """RMSProp decay (torch's ``alpha``)."""
    momentum: float = 0.0
    """RMSProp momentum."""
    epsilon: float = 0.1
    """RMSProp epsilon."""
    rollout_fragment_length: int = derived(50, "rollout.rollout_fragment_length")
    """Length T of the V-trace sequences the train batch is cut into."""

    def validate(self) -> list[str]:
        """Ranges of every setting."""
        problems = super().validate()
        checks = [
            ("rollout_fragment_length", self.rollout_fragment_length >= 1, ">= 1"),
            ("vtrace_clip_rho_threshold",
             self.vtrace_clip_rho_threshold is None or self.vtrace_clip_rho_threshold > 0,
             "> 0 or None"),
            ("vtrace_clip_pg_rho_threshold",
             self.vtrace_clip_pg_rho_threshold is None or self.vtrace_clip_pg_rho_threshold > 0,
             "> 0 or None"),
            ("vf_loss_coeff", self.vf_loss_coeff >= 0, ">= 0"),
            ("entropy_coeff", self.entropy_coeff >= 0, ">= 0"),
            ("opt_type", self.opt_type in ("adam", "rmsprop"), "'adam' or 'rmsprop'"),
            ("decay", 0.0 <= self.decay < 1.0, "in [0, 1)"),
            ("momentum", self.momentum >= 0, ">= 0"),
            ("epsilon", self.epsilon > 0, "> 0"),
        ]
        problems += check_schedule("entropy_coeff_schedule", self.entropy_coeff_schedule)
        return problems + [f"{name} must be {allowed}, got {getattr(self, name)!r}"
                           for name, ok, allowed in checks if not ok]


@dataclass(frozen=True, kw_only=True)
class APPOPolicyConfig(ImpalaPolicyConfig):
    """The settings of ``actorrl.policy.appo.APPOPolicy`` (RLlib's APPO defaults)."""

    clip_param: float = 0.4
    """PPO clip of the probability ratio of the learner policy over the old (target)
    policy: the surrogate uses ``clip(ratio, 1 - clip_param, 1 + clip_param)``."""
    use_kl_loss: bool = False
    """Add ``kl_coeff * KL(old policy || learner policy)`` to the loss (adapted toward
    ``kl_target`` at every target-network update)."""
    kl_coeff: float = 1.0
    """Initial weight of the KL term."""
    kl_target: float = 0.01
    """The KL the adaptive coefficient steers toward (x1.5 above twice it, x0.5 below half)."""
    lambda_: float = 1.0
    """GAE lambda (key ``lambda``), with ``vtrace: false``."""
    use_gae: bool = True
    """GAE advantages with ``vtrace: false`` (else discounted returns minus the baseline)."""
    use_critic: bool = True
    """Learn a value baseline (needed by GAE), with ``vtrace: false``."""
    target_update_frequency: int = 0
    """Learner updates between two syncs of the old-policy (target) network from the
    learner's; 0 (default): ``num_sgd_iter * minibatch_buffer_size``, RLlib's rule."""
    num_sgd_iter: int = derived(1, "learner.num_sgd_iter")
    """Passes over each train batch (sets the default target-update period)."""
    minibatch_buffer_size: int = derived(1, "learner.minibatch_buffer_size")
    """Batches the learner cycles through (sets the default target-update period)."""

    def validate(self) -> list[str]:
        """Ranges of the surrogate and KL settings."""
        problems = super().validate()
        checks = [
            ("clip_param", self.clip_param, self.clip_param > 0, "> 0"),
            ("kl_coeff", self.kl_coeff, self.kl_coeff >= 0, ">= 0"),
            ("kl_target", self.kl_target, self.kl_target > 0, "> 0"),
            ("lambda", self.lambda_, 0.0 <= self.lambda_ <= 1.0, "in [0, 1]"),
            ("target_update_frequency", self.target_update_frequency,
             self.target_update_frequency >= 0, ">= 0 (0: num_sgd_iter * minibatch_buffer_size)"),
        ]
        problems += [f"{name} must be {allowed}, got {value!r}"
                     for name, value, ok, allowed in checks if not ok]
        if not self.vtrace and self.use_gae and not self.use_critic:
            problems.append("use_gae=True needs use_critic=True (got use_critic=False)")
        return problems

    @property
    def target_update_period(self) -> int:
        """Learner updates between two target-network syncs."""
        return self.target_update_frequency or self.num_sgd_iter * self.minibatch_buffer_size


# ---- A2C / A3C ----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ActorCriticPolicyConfig(PolicyConfig):
    """The settings of ``actorrl.policy.actor_critic.ActorCriticPolicy``."""

    lr: float = 1e-4
    """Adam learning rate."""
    lambda_: float = 1.0
    """GAE lambda (key ``lambda``; 1.0: discounted returns minus the baseline)."""
    use_gae: bool = True
    """Generalized advantage estimation (needs ``use_critic``)."""
    use_critic: bool = True
    """Learn a value baseline (False: plain policy gradient on returns)."""
    vf_loss_coeff: float = 0.5
    """Weight of the value loss."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus (unless ``entropy_coeff_schedule`` is set)."""
    entropy_coeff_schedule: list[list[float]] | None = None
    """Entropy weight over global env steps, as ``lr_schedule``; replaces
    ``entropy_coeff``, whose current value the learner stats report."""

    def validate(self) -> list[str]:
        """lambda in [0, 1], vf_loss_coeff >= 0, GAE only with a critic."""
        problems = super().validate()
        if not 0.0 <= self.lambda_ <= 1.0:
            problems.append(f"lambda must be in [0, 1], got {self.lambda_}")
        if self.vf_loss_coeff < 0:
            problems.append(f"vf_loss_coeff must be >= 0, got {self.vf_loss_coeff}")
        if self.use_gae and not self.use_critic:
            problems.append("use_gae=True needs use_critic=True (got use_critic=False)")
        problems += check_schedule("entropy_coeff_schedule", self.entropy_coeff_schedule)
        return problems


# ---- PPO ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PPOPolicyConfig(ActorCriticPolicyConfig):
    """The settings of ``actorrl.policy.ppo.PPOPolicy`` (RLlib's PPO defaults)."""

    lr: float = 5e-5
    """Adam learning rate (unless ``lr_schedule`` is set)."""
    grad_clip: float | None = None
    """Global gradient-norm clip; ``None`` (RLlib's PPO default) disables it."""
    vf_loss_coeff: float = 1.0
    """Weight of the (clamped) value loss."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (unless ``entropy_coeff_schedule`` is set)."""
    clip_param: float = 0.3
    """PPO clip: the probability ratio is clipped to ``[1 - clip_param, 1 + clip_param]``."""
    vf_clip_param: float = 10.0
    """The squared value error is clamped to ``[0, vf_clip_param]`` (RLlib's clamp of the
    squared error, not PPO2's clipping of the value change): scale it to the returns."""
    kl_coeff: float = 0.2
    """Initial weight of the KL(behaviour || current) penalty; adapted after every train
    step towards ``kl_target`` (0: no KL term)."""
    kl_target: float = 0.01
    """The KL the adaptive ``kl_coeff`` aims at (x1.5 above twice it, x0.5 below half)."""
    use_kl_loss: bool = True
    """Whether the loss has the KL term at all (with ``kl_coeff > 0``)."""

    def validate(self) -> list[str]:
        """The actor-critic checks plus positive clips, kl_coeff >= 0, kl_target > 0,
        entropy_coeff >= 0."""
        problems = super().validate()
        checks = [
            ("clip_param", self.clip_param > 0, "> 0"),
            ("vf_clip_param", self.vf_clip_param > 0, "> 0"),
            ("kl_coeff", self.kl_coeff >= 0, ">= 0"),
            ("kl_target", self.kl_target > 0, "> 0"),
            ("entropy_coeff", self.entropy_coeff >= 0, ">= 0"),
        ]
        return problems + [f"{name} must be {allowed}, got {getattr(self, name)!r}"
                           for name, ok, allowed in checks if not ok]
