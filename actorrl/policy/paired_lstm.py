"""One acting step of both branches of a two-branch LSTM actor-critic, as one network.

:class:`~actorrl.policy.models.LSTMActorCriticModel` keeps a policy branch and a value
branch (an encoder and an LSTM each, unless ``vf_share_layers``), and a worker must step
both at every env step: the value LSTM's state is part of what each sequence starts from.
With small MLP branches (CartPole's ``[64]`` and a 64-cell LSTM, four envs per worker) that
step costs mostly per-op overhead, not arithmetic (an ``lstm_cell`` call of one 64-cell
branch takes ~70 us here, of both paired ~110 us). :class:`PairedBranches` runs the two
branches as one network with twice the width: the first layers stacked (both read the same
observation), the deeper layers and the LSTM block-diagonal (the zero blocks keep the
branches apart, so each output equals its own branch's to float rounding). That halves the
op count of the step (~185 against ~235 us per 4-env CartPole step); the extra arithmetic
on the zero blocks stays small up to :data:`MAX_PAIRED_CELL` cells, beyond which (and for
conv encoders) the model steps the branches one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

MAX_PAIRED_CELL = 128
"""Largest LSTM cell that is paired: above it, the zero blocks' arithmetic would outweigh
the ops saved."""


def _mlp_layers(encoder: nn.Module) -> tuple[nn.Module, list[nn.Linear], nn.Module] | None:
    """``(pre, linears, activation)`` of an encoder ``build_encoder`` made for a flat or
    discrete observation (``Sequential(pre, Sequential(Linear, act, ...))``), else None."""
    if not (isinstance(encoder, nn.Sequential) and len(encoder) == 2):
        return None
    pre, mlp = encoder[0], encoder[1]
    if any(True for _ in pre.parameters()) or not isinstance(mlp, nn.Sequential) \
            or len(mlp) == 0 or len(mlp) % 2:
        return None
    linears, activations = list(mlp)[0::2], list(mlp)[1::2]
    if not all(isinstance(layer, nn.Linear) for layer in linears) or \
            len({type(act) for act in activations}) != 1 or \
            any(any(True for _ in act.parameters()) for act in activations):
        return None
    return pre, linears, activations[0]


class PairedBranches:
    """Steps a policy and a value branch (same MLP encoder shapes, two LSTMs) as one
    network; the fused weights are rebuilt whenever a parameter changed (an optimizer
    step, ``load_state_dict``)."""

    def __init__(self, policy_encoder: nn.Module, value_encoder: nn.Module,
                 policy_lstm: nn.LSTM, value_lstm: nn.LSTM) -> None:
        policy, value = _mlp_layers(policy_encoder), _mlp_layers(value_encoder)
        assert policy is not None and value is not None
        self.pre, self.policy_linears, self.activation = policy
        self.value_linears = value[1]
        self.policy_lstm, self.value_lstm = policy_lstm, value_lstm
        self.cell = policy_lstm.hidden_size
        self.features = self.policy_linears[-1].out_features
        self._params = [p for module in (*self.policy_linears, *self.value_linears,
                                         policy_lstm, value_lstm)
                        for p in module.parameters()]
        self._key: tuple[tuple[int, int], ...] | None = None
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._lstm: tuple[torch.Tensor, ...] = ()

    @staticmethod
    def supports(policy_encoder: nn.Module, value_encoder: nn.Module, policy_lstm: nn.LSTM,
                 value_lstm: nn.LSTM) -> bool:
        """Whether the two branches can be paired: MLP encoders of equal shapes and
        activation, one-layer LSTMs with biases of at most :data:`MAX_PAIRED_CELL` cells."""
        policy, value = _mlp_layers(policy_encoder), _mlp_layers(value_encoder)
        if policy is None or value is None or type(policy[2]) is not type(value[2]):
            return False
        shapes = [[tuple(layer.weight.shape) for layer in layers]
                  for layers in (policy[1], value[1])]
        return (shapes[0] == shapes[1] and policy_lstm.num_layers == 1
                and value_lstm.num_layers == 1 and policy_lstm.bias and value_lstm.bias
                and policy_lstm.hidden_size == value_lstm.hidden_size <= MAX_PAIRED_CELL
                and policy_lstm.input_size == value_lstm.input_size)

    def _fuse(self) -> None:
        """Build the stacked and block-diagonal weights from the branches' parameters."""
        layers = []
        for depth, (p, v) in enumerate(zip(self.policy_linears, self.value_linears,
                                           strict=True)):
            weight = (torch.cat([p.weight, v.weight]) if depth == 0
                      else torch.block_diag(p.weight, v.weight))
            layers.append((weight, torch.cat([p.bias, v.bias])))
        cell = self.cell
        fused = []
        for name in ("weight_ih_l0", "weight_hh_l0"):
            p, v = getattr(self.policy_lstm, name), getattr(self.value_lstm, name)
            width = p.shape[1]
            # Gate-major rows (i, f, g, o), each gate's rows policy then value, so that
            # lstm_cell's split into four gates of 2 * cell keeps the branches apart.
            weight = p.new_zeros(4, 2, cell, 2, width)
            weight[:, 0, :, 0] = p.view(4, cell, width)
            weight[:, 1, :, 1] = v.view(4, cell, width)
            fused.append(weight.view(8 * cell, 2 * width))
        for name in ("bias_ih_l0", "bias_hh_l0"):
            p, v = getattr(self.policy_lstm, name), getattr(self.value_lstm, name)
            fused.append(torch.stack([p.view(4, cell), v.view(4, cell)], 1).reshape(-1))
        self._layers, self._lstm = layers, tuple(fused)

    def step(self, obs: torch.Tensor, state: Sequence[torch.Tensor],
             extra: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One step (no autograd): ``state`` is ``[h_p, c_p, h_v, c_v]`` (``[B, cell]``
        each), ``extra`` the previous action / reward features both LSTMs read. Returns the
        new ``[h_p, c_p, h_v, c_v]``."""
        # A tensor's version counter moves with every in-place write (optimizer steps,
        # load_state_dict's copies); data_ptr with a replaced tensor (.to(device)).
        key = tuple((p._version, p.data_ptr()) for p in self._params)
        if key != self._key:
            self._fuse()
            self._key = key
        x = self.pre(obs)
        for weight, bias in self._layers:
            x = self.activation(torch.nn.functional.linear(x, weight, bias))
        if extra:
            features = self.features
            x = torch.cat([x[:, :features], *extra, x[:, features:], *extra], dim=-1)
        h, c = torch.lstm_cell(x, (torch.cat([state[0], state[2]], dim=-1),
                                   torch.cat([state[1], state[3]], dim=-1)), *self._lstm)
        cell = self.cell
        return [h[:, :cell], c[:, :cell], h[:, cell:], c[:, cell:]]
