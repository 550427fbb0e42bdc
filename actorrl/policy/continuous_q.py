"""Pieces shared by the actor-critic Q-learning policies (SAC, DDPG/TD3): Q networks over
``(obs, action)``, Xavier-initialised MLPs, calls that keep gradients off a network's
parameters, the target networks' values, and soft target updates.

The actor of these policies learns through a Q network whose parameters must not move with
the actor's loss: :func:`detached_call` evaluates a network with its parameters detached,
so one backward pass of the summed losses gives each parameter the gradient of its own
loss only. :class:`SoftTargetPolicy` keeps the target networks and their update counters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.encoders import activation_class, build_encoder
from actorrl.policy.model_config import resolve_model_config
from actorrl.policy.target_networks import TargetNetworkPolicy

ADAM_EPSILON = 1e-7
"""The Adam epsilon of RLlib's SAC and DDPG torch policies (tf.keras's default)."""


def build_xavier_mlp(in_dim: int, hiddens: list[int], activation: str | None, out_dim: int
                     ) -> nn.Sequential:
    """Linear + activation per hidden layer, then a linear output; Xavier-uniform weights
    and zero biases (RLlib's DDPG layers)."""
    act = activation_class(activation or "linear")
    layers: list[nn.Module] = []
    size = in_dim
    for hidden in [*hiddens, out_dim]:
        layer = nn.Linear(size, int(hidden))
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)
        layers.append(layer)
        layers.append(act())
        size = int(hidden)
    return nn.Sequential(*layers[:-1])


MLPBuilder = Callable[[int, list[int], "str | None", int], nn.Sequential]
"""``(in_dim, hiddens, activation, out_dim) -> MLP``: how a :class:`QNetwork` builds its
layers (:func:`build_xavier_mlp`, or SAC's :func:`actorrl.policy.sac.build_fcnet_mlp`)."""


def observation_encoder(obs_space: gym.Space, model: Mapping[str, Any] | None
                        ) -> tuple[nn.Module, int]:
    """Observations -> features without hidden layers: flattened (or one-hot) vectors, or
    the conv stack of ``model`` (``conv_filters``...) for images."""
    cfg = {**resolve_model_config(model), "fcnet_hiddens": []}
    return build_encoder(obs_space, cfg)


class QNetwork(nn.Module):
    """``Q(s, a)``: the observation's features concatenated with the action through an MLP
    to one value (continuous actions); with ``num_actions``, one Q-value per action from
    the features alone (discrete). ``net`` holds ``fcnet_hiddens`` and
    ``fcnet_activation``; ``build_mlp`` makes the layers (default: Xavier-initialised)."""

    def __init__(self, obs_space: gym.Space, model: Mapping[str, Any],
                 net: Mapping[str, Any], action_dim: int, num_actions: int | None,
                 build_mlp: MLPBuilder = build_xavier_mlp) -> None:
        super().__init__()
        self.encoder, features = observation_encoder(obs_space, model)
        self.discrete = num_actions is not None
        in_dim = features if self.discrete else features + action_dim
        self.mlp = build_mlp(in_dim, list(net["fcnet_hiddens"]), net["fcnet_activation"],
                             num_actions if num_actions is not None else 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` Q-values of ``actions`` (continuous) or ``[B, n]`` (discrete)."""
        features = self.encoder(obs)
        if self.discrete:
            return self.mlp(features)
        assert actions is not None
        return self.mlp(torch.cat([features, actions.float()], dim=-1)).squeeze(-1)


def detached_call(module: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    """``module(*args)`` with its parameters detached: gradients reach the inputs only."""
    params = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, params, args)


def on_target(networks: Iterable[nn.Module], obs: torch.Tensor,
              actions: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Each target network's values of ``obs`` (and ``actions``), computed on the target
    networks' device (a learner tower may be elsewhere) and returned on ``obs``'s."""
    out = []
    for net in networks:
        device = next(net.parameters()).device
        args = [obs.to(device)] + ([] if actions is None else [actions.to(device)])
        out.append(net(*args).to(obs.device))
    return out


def min_q(values: list[torch.Tensor]) -> torch.Tensor:
    """The minimum over twin Q values row by row (the one value without a twin)."""
    return values[0] if len(values) == 1 else torch.min(values[0], values[1])


def soft_update(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target``, in place (1.0 copies)."""
    with torch.no_grad():
        torch._foreach_lerp_(target, [p.to(t.device) for p, t in zip(online, target)], tau)




class SoftTargetPolicy(TargetNetworkPolicy):
    """A policy with target networks that follow the online ones softly: ``target <- tau *
    online + (1 - tau) * target`` (:meth:`update_target`) once ``target_network_update_freq``
    rows were trained since the last update (0 or 1: after every update), and a full copy
    at the start. The rows of an update are the batch's ``count`` for ``learn_on_batch``
    and for ``compute_gradients`` + ``apply_gradients`` on this same policy; gradients
    computed elsewhere count ``train_batch_size`` rows. Subclasses call
    :meth:`init_targets` after the base ``__init__`` and name the parameters that follow
    (:meth:`soft_target_parameters`); their config has ``tau``,
    ``target_network_update_freq`` and ``train_batch_size``."""

    target_model: nn.Module

    def init_targets(self) -> None:
        """The target model (a frozen copy of the model) and the update counters."""
        self.target_model = copy.deepcopy(self.model)
        self.target_model.requires_grad_(False)
        self.target_model.eval()
        self.num_steps_trained = 0
        self.last_target_update_steps = 0
        self.num_target_updates = 0
        self._pending_rows = 0
        self._actor_weight_names = frozenset(
            k for k in self.model.state_dict() if k.startswith("policy."))

    def soft_target_parameters(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(online, target)``: the parameters the targets follow, in matching order."""
        raise NotImplementedError

    def acting_weight_names(self) -> frozenset[str] | None:
        """The actor's weights (the model's ``policy`` module): a rollout worker acts with
        them alone, so weight syncs leave the Q networks (most of the model) at the
        learner."""
        return self._actor_weight_names

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Gradients as in the base; the rows count toward the target update when these
        gradients are applied to this policy."""
        grads, info = super().compute_gradients(batch)
        self._pending_rows += batch.count
        return grads, info

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        """One SGD step; returns ``learner_stats`` (with ``num_target_updates``) and the
        per-row outputs (``td_error``)."""
        self._pending_rows += batch.count
        info = super().learn_on_batch(batch)
        info["learner_stats"]["num_target_updates"] = float(self.num_target_updates)
        return info

    def after_update(self, num_updates: int) -> None:
        """Count the rows of the update just applied; soft-update the targets once
        ``target_network_update_freq`` rows were trained since the last update."""
        rows = self._pending_rows or self.config.train_batch_size  # type: ignore[attr-defined]
        self._pending_rows = 0
        self.num_steps_trained += rows
        since = self.num_steps_trained - self.last_target_update_steps
        if since >= self.config.target_network_update_freq:  # type: ignore[attr-defined]
            self.update_target()

    def update_target(self, tau: float | None = None) -> None:
        """Move the targets toward the online networks by ``tau`` (the config's by
        default; 1.0 copies)."""
        tau = self.config.tau if tau is None else tau  # type: ignore[attr-defined]
        online, target = self.soft_target_parameters()
        soft_update(target, online, tau)
        self.last_target_update_steps = self.num_steps_trained
        self.num_target_updates += 1


__all__ = ["ADAM_EPSILON", "QNetwork", "SoftTargetPolicy", "build_xavier_mlp",
           "detached_call", "min_q", "observation_encoder", "on_target", "soft_update"]
