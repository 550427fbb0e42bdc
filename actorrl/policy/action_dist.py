"""Action distributions over a batch of model outputs.

``dist_class_for(action_space)`` picks the distribution; ``cls.required_outputs(space)``
says how many model outputs it reads per row.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from actorrl.data.actions import is_bounded_box


class ActionDistribution:
    """A batch of distributions parameterized by model outputs ``inputs`` [B, num_outputs]."""

    def __init__(self, inputs: torch.Tensor) -> None:
        self.inputs = inputs

    @staticmethod
    def required_outputs(action_space: gym.Space) -> int:
        """Model outputs per row needed for ``action_space``."""
        raise NotImplementedError

    def sample(self) -> torch.Tensor:
        """One random action per row."""
        raise NotImplementedError

    def deterministic_sample(self) -> torch.Tensor:
        """The most likely action per row."""
        raise NotImplementedError

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability (density) of ``actions``, shape [B]."""
        raise NotImplementedError

    def entropy(self) -> torch.Tensor:
        """Entropy per row, shape [B]."""
        raise NotImplementedError

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        """KL(self || other) per row, shape [B]."""
        raise NotImplementedError


class Categorical(ActionDistribution):
    """Categorical over ``Discrete(n)`` actions; inputs are unnormalized logits [B, n]."""

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.log_probs = F.log_softmax(inputs, dim=-1)

    @staticmethod
    def required_outputs(action_space: gym.Space) -> int:
        """``n`` logits."""
        return int(action_space.n)

    def sample(self) -> torch.Tensor:
        """Sampled indices (int64), by the Gumbel-max trick (faster than multinomial)."""
        gumbel = -torch.empty_like(self.log_probs).exponential_().log()
        return (self.log_probs + gumbel).argmax(dim=-1)

    def deterministic_sample(self) -> torch.Tensor:
        """Argmax indices (int64)."""
        return self.inputs.argmax(dim=-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        """Log-probability of integer ``actions`` [B]."""
        return self.log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """-sum p log p."""
        return -(self.log_probs.exp() * self.log_probs).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        """sum p (log p - log q)."""
        assert isinstance(other, Categorical)
        return (self.log_probs.exp() * (self.log_probs - other.log_probs)).sum(-1)


class DiagGaussian(ActionDistribution):
    """Independent Gaussians over 1-D ``Box`` actions; inputs are ``[mean, log_std]``
    concatenated, [B, 2 * action_dim]."""

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.mean, self.log_std = torch.chunk(inputs, 2, dim=-1)
        self.std = self.log_std.exp()

    @staticmethod
    def required_outputs(action_space: gym.Space) -> int:
        """A mean and a log standard deviation per action dimension."""
        return 2 * int(math.prod(action_space.shape))

    def sample(self) -> torch.Tensor:
        """mean + std * N(0, 1)."""
        return self.mean + self.std * torch.randn_like(self.mean)

    def deterministic_sample(self) -> torch.Tensor:
        """The mean."""
        return self.mean

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        """Sum over dimensions of the Gaussian log-density."""
        z = (actions - self.mean) / self.std
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        """Sum over dimensions of log std + 0.5 log(2 pi e)."""
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        """Closed-form KL between diagonal Gaussians."""
        assert isinstance(other, DiagGaussian)
        var_ratio = (self.std / other.std).pow(2)
        mean_term = ((self.mean - other.mean) / other.std).pow(2)
        return 0.5 * (var_ratio + mean_term - 1.0 - var_ratio.log()).sum(-1)


LOG_STD_MIN = -20.0
"""Lower bound of :class:`NormalizedDiagGaussian`'s log standard deviations."""
LOG_STD_MAX = 2.0
"""Upper bound of :class:`NormalizedDiagGaussian`'s log standard deviations: a standard
deviation of e^2 = 7.4 spreads over the normalised range [-1, 1] many times already."""


class NormalizedDiagGaussian(DiagGaussian):
    """:class:`DiagGaussian` for a policy acting in the normalised space of
    ``normalize_actions`` (actions in [-1, 1], unsquashed and clipped to the bounds for the
    env), with its log standard deviations clamped to [``LOG_STD_MIN``, ``LOG_STD_MAX``].

    Why the bound: the env only sees the clipped action, so once a standard deviation is
    several times the range, the policy the env sees (almost always one of the two bounds,
    chosen with probability ``Phi(mean / std)``) no longer depends on it: the loss is flat
    along that direction and nothing pulls the log-std back. Where the return hardly depends
    on the action, the minibatch noise of its gradient, scaled to full steps by Adam, then
    walks a state-dependent log-std upwards without end (RLlib's pendulum-ppo file reached
    -556 at 250k env steps here, then log-stds of 16-37 near the upright position and -950 at
    500k). Clamped, the gradient past the bound is zero and the walk stops where the
    standard deviation already covers the range."""

    def __init__(self, inputs: torch.Tensor) -> None:
        ActionDistribution.__init__(self, inputs)
        self.mean, log_std = torch.chunk(inputs, 2, dim=-1)
        self.log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        self.std = self.log_std.exp()


class MultiCategorical(ActionDistribution):
    """Independent categoricals over ``MultiDiscrete(nvec)`` actions (RLlib's
    MultiCategorical): inputs are the components' logits side by side [B, sum(nvec)];
    actions are [B, len(nvec)]. Log-probabilities, entropies and KLs sum over components.

    Built per space by :meth:`for_space` (the split sizes are part of the class)."""

    nvec: tuple[int, ...] = ()

    def __init__(self, inputs: torch.Tensor) -> None:
        super().__init__(inputs)
        self.cats = [Categorical(part) for part in torch.split(inputs, list(self.nvec), -1)]

    @classmethod
    def for_space(cls, action_space: gym.spaces.MultiDiscrete) -> type[MultiCategorical]:
        """The subclass for ``action_space`` (a 1-D ``MultiDiscrete`` starting at 0)."""
        nvec = tuple(int(n) for n in action_space.nvec)
        return type(f"MultiCategorical{list(nvec)}", (cls,), {"nvec": nvec})

    @staticmethod
    def required_outputs(action_space: gym.Space) -> int:
        """``sum(nvec)`` logits."""
        return int(sum(int(n) for n in action_space.nvec))

    def sample(self) -> torch.Tensor:
        """One sampled index per component: [B, len(nvec)] int64."""
        return torch.stack([cat.sample() for cat in self.cats], dim=-1)

    def deterministic_sample(self) -> torch.Tensor:
        """Each component's argmax: [B, len(nvec)]."""
        return torch.stack([cat.deterministic_sample() for cat in self.cats], dim=-1)

    def logp(self, actions: torch.Tensor) -> torch.Tensor:
        """Sum of the components' log-probabilities [B]."""
        actions = actions.reshape(actions.shape[0], len(self.cats))
        return torch.stack([cat.logp(actions[:, i]) for i, cat in enumerate(self.cats)],
                           dim=-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        """Sum of the components' entropies [B]."""
        return torch.stack([cat.entropy() for cat in self.cats], dim=-1).sum(-1)

    def kl(self, other: ActionDistribution) -> torch.Tensor:
        """Sum of the components' KLs [B]."""
        assert isinstance(other, MultiCategorical)
        return torch.stack([a.kl(b) for a, b in zip(self.cats, other.cats)], dim=-1).sum(-1)


def dist_class_for(action_space: gym.Space, normalize_actions: bool = False
                   ) -> type[ActionDistribution]:
    """Categorical for ``Discrete``, MultiCategorical for a 1-D ``MultiDiscrete``,
    DiagGaussian for a 1-D ``Box`` (NormalizedDiagGaussian for a bounded float one with
    ``normalize_actions``); ``ValueError`` else."""
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        if action_space.nvec.ndim != 1 or (action_space.start != 0).any():
            raise ValueError(f"MultiDiscrete action spaces must be 1-D and start at 0, got "
                             f"{action_space!r}")
        return MultiCategorical.for_space(action_space)
    if isinstance(action_space, gym.spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"Discrete action spaces must start at 0, got {action_space!r}")
        return Categorical
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        if normalize_actions and is_bounded_box(action_space) \
                and not np.issubdtype(action_space.dtype, np.integer):
            return NormalizedDiagGaussian
        return DiagGaussian
    raise ValueError(f"no action distribution for action space {action_space!r}; "
                     f"supported: Discrete, MultiDiscrete, 1-D Box")
