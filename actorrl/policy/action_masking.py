"""Action masks for discrete policies, in RLlib's convention (its ``ActionMaskModel``).

An env that forbids some actions in some states gives a ``Dict`` observation with two keys:
``action_mask`` (a 0/1 vector, one entry per action: ``Discrete(n)`` has ``n``, a
``MultiDiscrete(nvec)`` ``sum(nvec)``, its components' side by side) and ``observations``
(the observation proper, any supported space). The rollout worker flattens the ``Dict``
into one float32 vector like every structured observation (:mod:`actorrl.data.spaces`:
keys in sorted order, so the mask comes first); the policy's model is then a
:class:`MaskedModel`:

- the inner model (the catalog's or ``model.custom_model``) is built on the
  ``observations`` subspace alone and sees only that part of the vector (a ``Box`` in its
  own shape, a ``Discrete`` as its index, anything else as its flat vector);
- its outputs (logits or Q-values) get ``0`` where the mask is 1 and the float32 minimum
  where it is 0 (``logits + clamp(log(mask), min=FLOAT_MIN)``), so a masked action has
  probability 0 (it is never sampled, and its logit gets no gradient) and a masked Q-value
  is never a greedy action nor the max of a target. The result stays finite, so gradients
  and KL terms do too. A row whose mask is all zeros (an agent with no legal move, e.g.
  the final observation of a finished game) is left unmasked.

Categorical policies (PPO, APPO, IMPALA, A2C/A3C) need nothing else. DQN / Ape-X also
draws its epsilon-random actions among the legal ones (:meth:`ActionMaskLayout.legal`).
Recurrent models are wrapped by :class:`MaskedRecurrentModel`, which masks every step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.spaces import flat_leaves, flat_size
from actorrl.policy.model_config import missing_recurrent_methods
from actorrl.policy.recurrent import step_model

ACTION_MASK = "action_mask"
"""Key of the mask in a masked ``Dict`` observation."""
OBSERVATIONS = "observations"
"""Key of the observation proper in a masked ``Dict`` observation."""
FLOAT_MIN = float(torch.finfo(torch.float32).min)
"""What a masked output gets added (RLlib's ``FLOAT_MIN``)."""
MASKED_BELOW = FLOAT_MIN / 2
"""Outputs below this are masked ones (used to leave them out of statistics)."""


def mask_size(action_space: gym.Space) -> int:
    """The number of mask entries ``action_space`` needs: ``n`` for ``Discrete(n)``,
    ``sum(nvec)`` for ``MultiDiscrete``; ``ValueError`` for other spaces."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    raise ValueError(f"action masks apply to Discrete and MultiDiscrete action spaces, not "
                     f"{action_space!r}: drop the 'action_mask' key from the observation "
                     f"space")


@dataclass(frozen=True)
class ActionMaskLayout:
    """Where the mask and the observation proper lie in a flattened masked observation."""

    mask_start: int
    mask_size: int
    obs_start: int
    obs_size: int
    observations: gym.Space
    """The ``observations`` subspace: what the inner model is built on."""

    @classmethod
    def of(cls, space: gym.Space) -> ActionMaskLayout | None:
        """The layout of ``space`` when it is a masked ``Dict`` (keys ``action_mask`` and
        ``observations``); None for any other space. ``ValueError`` for a ``Dict`` with an
        ``action_mask`` key that does not follow the convention."""
        if not isinstance(space, gym.spaces.Dict) or ACTION_MASK not in space.spaces:
            return None
        keys = set(space.spaces)
        if keys != {ACTION_MASK, OBSERVATIONS}:
            raise ValueError(
                f"an observation space with an {ACTION_MASK!r} key must have exactly the keys "
                f"{ACTION_MASK!r} and {OBSERVATIONS!r} (RLlib's action-mask convention), got "
                f"{sorted(keys)}: put everything else in a Dict under {OBSERVATIONS!r}")
        mask_space = space.spaces[ACTION_MASK]
        if not (isinstance(mask_space, gym.spaces.MultiBinary) or (
                isinstance(mask_space, gym.spaces.Box) and len(mask_space.shape) == 1)):
            raise ValueError(f"the {ACTION_MASK!r} space must be a 1-D Box or a MultiBinary "
                             f"with one 0/1 entry per action, got {mask_space!r}")
        leaves = flat_leaves(space)
        mask_leaf = next(leaf for leaf in leaves if leaf.path == f"obs[{ACTION_MASK!r}]")
        obs_leaves = [leaf for leaf in leaves
                      if leaf.path.startswith(f"obs[{OBSERVATIONS!r}]")]
        obs_start = min(leaf.start for leaf in obs_leaves)
        obs_size = flat_size(space.spaces[OBSERVATIONS])
        return cls(mask_leaf.start, mask_leaf.size, obs_start, obs_size,
                   space.spaces[OBSERVATIONS])

    def check_action_space(self, action_space: gym.Space) -> None:
        """``ValueError`` unless the mask has one entry per action of ``action_space``."""
        needed = mask_size(action_space)
        if needed != self.mask_size:
            raise ValueError(f"the {ACTION_MASK!r} has {self.mask_size} entries but action "
                             f"space {action_space!r} needs {needed} (one per action)")

    def split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(observations, mask)`` of flat masked observations ``[..., flat]``: the
        observations as the inner model takes them (see the module docstring), the mask
        ``[..., mask_size]``."""
        lead = obs.shape[:-1]
        mask = obs[..., self.mask_start:self.mask_start + self.mask_size]
        inner = obs[..., self.obs_start:self.obs_start + self.obs_size]
        space = self.observations
        if isinstance(space, gym.spaces.Box):
            inner = inner.reshape(*lead, *space.shape)
        elif isinstance(space, gym.spaces.Discrete):
            inner = inner.argmax(dim=-1) + int(space.start)
        return inner, mask

    def legal(self, obs: np.ndarray) -> np.ndarray:
        """Boolean ``[B, mask_size]`` legal actions of flat masked observations ``[B, flat]``
        (every action of a row with none legal, as :func:`mask_outputs` treats it)."""
        mask = np.asarray(obs)[..., self.mask_start:self.mask_start + self.mask_size] > 0
        return mask | ~mask.any(axis=-1, keepdims=True)


def mask_outputs(outputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``outputs`` with :data:`FLOAT_MIN` added where ``mask`` is 0 (nothing where it is 1,
    nothing in rows with no 1 at all); the gradient passes to ``outputs`` unchanged."""
    legal = mask > 0
    legal = legal | ~legal.any(dim=-1, keepdim=True)
    penalty = torch.zeros((), dtype=outputs.dtype, device=outputs.device)
    return outputs + torch.where(legal, penalty, torch.full_like(penalty, FLOAT_MIN))


def legal_values(values: torch.Tensor) -> torch.Tensor:
    """The entries of ``values`` that are not masked (for statistics such as mean Q)."""
    return values[values > MASKED_BELOW]


class MaskedModel(nn.Module):
    """Wraps a model built on the ``observations`` subspace: ``forward(obs)`` takes the flat
    masked observation and returns the inner model's outputs masked (see the module
    docstring). Models returning ``(outputs, value)`` and Q-networks returning a tensor are
    both handled."""

    def __init__(self, inner: nn.Module, layout: ActionMaskLayout) -> None:
        super().__init__()
        self.inner = inner
        self.layout = layout

    def forward(self, obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The inner model's outputs on the observations, the first one masked."""
        inner_obs, mask = self.layout.split(obs)
        out = self.inner(inner_obs)
        if isinstance(out, tuple):
            return (mask_outputs(out[0], mask), *out[1:])
        return mask_outputs(out, mask)

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The masked policy outputs alone (the inner model's ``policy_outputs`` when it
        has one: acting without a critic)."""
        inner_obs, mask = self.layout.split(obs)
        policy_outputs = getattr(self.inner, "policy_outputs", None)
        outputs = policy_outputs(inner_obs) if policy_outputs else self.inner(inner_obs)[0]
        return mask_outputs(outputs, mask)


class MaskedRecurrentModel(MaskedModel):
    """:class:`MaskedModel` for a recurrent inner model: the recurrent interface of
    :class:`actorrl.policy.models.RecurrentModel`, every step's outputs masked."""

    def get_initial_state(self) -> list[torch.Tensor]:
        """The inner model's initial state."""
        return list(self.inner.get_initial_state())

    def _inner_inputs(self, inputs: Mapping[str, torch.Tensor]
                      ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        inner_obs, mask = self.layout.split(inputs["obs"])
        return {**inputs, "obs": inner_obs}, mask

    def forward_rnn(self, inputs: Mapping[str, torch.Tensor], state: Sequence[torch.Tensor],
                    seq_lens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """The inner ``forward_rnn`` on the observations, outputs masked."""
        inner_inputs, mask = self._inner_inputs(inputs)
        outputs, values, state_out = self.inner.forward_rnn(inner_inputs, state, seq_lens)
        return mask_outputs(outputs, mask), values, list(state_out)

    def forward_rnn_outputs(self, inputs: Mapping[str, torch.Tensor],
                            state: Sequence[torch.Tensor], seq_lens: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The inner ``forward_rnn_outputs`` (or ``forward_rnn``), outputs masked."""
        inner_inputs, mask = self._inner_inputs(inputs)
        forward_outputs = getattr(self.inner, "forward_rnn_outputs", None)
        if forward_outputs is not None:
            outputs, values = forward_outputs(inner_inputs, state, seq_lens)
        else:
            outputs, values, _ = self.inner.forward_rnn(inner_inputs, state, seq_lens)
        return mask_outputs(outputs, mask), values

    def forward_step(self, obs: torch.Tensor, state: Sequence[torch.Tensor],
                     prev_actions: torch.Tensor | None = None,
                     prev_rewards: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One step of the inner model (its ``forward_step`` or a length-1 unroll),
        outputs masked."""
        inner_obs, mask = self.layout.split(obs)
        outputs, values, state_out = step_model(self.inner, inner_obs, state, prev_actions,
                                                prev_rewards)
        return mask_outputs(outputs, mask), values, state_out


def masked_model(observation_space: gym.Space, action_space: gym.Space,
                 build: Callable[[gym.Space], nn.Module]) -> nn.Module:
    """``build(observation_space)``, or for a masked ``Dict`` observation space
    ``build(its observations subspace)`` wrapped in :class:`MaskedModel` (or
    :class:`MaskedRecurrentModel` when the built model is recurrent)."""
    layout = ActionMaskLayout.of(observation_space)
    if layout is None:
        return build(observation_space)
    layout.check_action_space(action_space)
    inner = build(layout.observations)
    if missing_recurrent_methods(inner):
        return MaskedModel(inner, layout)
    return MaskedRecurrentModel(inner, layout)


def mask_layout(model: nn.Module) -> ActionMaskLayout | None:
    """The layout of a masked model (None for any other model)."""
    return model.layout if isinstance(model, MaskedModel) else None


__all__ = [
    "ACTION_MASK", "FLOAT_MIN", "MASKED_BELOW", "OBSERVATIONS", "ActionMaskLayout",
    "MaskedModel", "MaskedRecurrentModel", "legal_values", "mask_layout", "mask_outputs",
    "mask_size", "masked_model",
]
