"""Default networks and the model catalog.

Model interface (policies rely on it; custom models must follow it)
    A model is a ``torch.nn.Module`` built as ``cls(obs_space, action_space, num_outputs,
    model_config)`` whose ``forward(obs)`` takes a batch of raw observations as a tensor
    (any dtype; uint8 images included) and returns ``(outputs, value)``: ``outputs``
    [B, num_outputs] (action-distribution inputs, or Q-values) and ``value`` [B] (the state
    value; models without a critic may return zeros).

Recurrent models (``model: {use_lstm: true}``, or a custom model implementing it)
    A :class:`RecurrentModel` carries state from step to step. It is built the same way
    and provides:

    ``get_initial_state() -> list[Tensor]``
        The state at an episode's start: a list of tensors, each one env's state (no
        batch dimension), e.g. ``[h, c]`` of shape ``[cell_size]`` each.
    ``forward_rnn(inputs, state, seq_lens) -> (outputs, values, state_out)``
        Runs ``B`` sequences of up to ``T`` steps. ``inputs["obs"]`` is ``[B, T, *obs]``;
        ``inputs["prev_actions"]`` (``[B, T, *action]``) and ``inputs["prev_rewards"]``
        (``[B, T]``) are present when the model config's ``lstm_use_prev_action`` /
        ``lstm_use_prev_reward`` are set (zeros at an episode's first step). ``state``
        holds each sequence's start state (``[B, ...]`` per tensor), ``seq_lens`` ``[B]``
        the number of real steps of each sequence (>= 1; later steps are padding, their
        outputs are ignored). Returns ``outputs`` ``[B, T, num_outputs]``, ``values``
        ``[B, T]`` and the state after each sequence's last real step.
    ``forward_rnn_outputs(inputs, state, seq_lens) -> (outputs, values)`` (optional)
        ``forward_rnn`` without the state out, which training unrolls do not need (the
        catalog's LSTM then skips packing the sequences); without it they call
        ``forward_rnn``.
    ``forward_step(obs, state, prev_actions, prev_rewards) -> (outputs, values, state_out)``
        (Optional.) One step of ``B`` envs without the time axis: ``obs`` ``[B, *obs]``,
        ``prev_actions`` / ``prev_rewards`` as read (else None); returns ``[B, n]``,
        ``[B]`` and the state after the step. Acting uses it when present (the catalog's
        LSTM has it), else ``forward_rnn`` with ``T = 1``; it must equal that.

    Policies act with ``T = 1`` (one step of every env of a worker in one call) and learn
    by unrolling over the recorded sequences (:mod:`actorrl.policy.recurrent`).
    :class:`LSTMActorCriticModel` is the catalog's: the encoder actorrl builds for the
    observation space (MLP or conv stack), then an LSTM over the features (plus the
    previous action and reward when configured), then policy and value heads.

Building blocks for other models
    :func:`~actorrl.policy.encoders.build_mlp` (a plain MLP) and
    :func:`~actorrl.policy.encoders.build_encoder` (observation -> feature vector: an MLP for
    flat observations, a conv net for rank-3 images, a complex encoder for structured
    spaces) live in :mod:`actorrl.policy.encoders`, shared with the DQN and IMPALA networks.

Images
    A rank-3 ``Box`` is an image, HWC (``[height, width, channels]``) or CHW. The order is
    ``channels_first`` when set; when it is None the channel axis must be told apart by
    shape: the one outer axis strictly smaller than both others (``(84, 84, 4)`` is HWC,
    ``(4, 84, 84)`` CHW). A shape with no such axis (``(84, 84, 84)``, ``(10, 3, 10)``) is
    refused with an error naming the shape and the key. uint8 frames stay uint8 until the
    first conv layer, which casts and scales them by 1/255 (to [0, 1]; with the model
    option ``zero_mean``, x/127.5 - 1, to [-1, 1]). ``dim``, ``grayscale`` and
    ``framestack`` shape Atari frames on the env side (``actorrl.envs.atari.model_env_config``);
    the default conv stack then follows the frame size (RLlib's 84x84 or 42x42 stack).

``model_config`` keys (RLlib names; unknown keys are rejected): see :data:`MODEL_DEFAULTS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from actorrl.policy.encoders import build_encoder, normc_init_
from actorrl.policy.model_config import missing_recurrent_methods, resolve_model_config
from actorrl.policy.paired_lstm import PairedBranches
from actorrl.util.classpath import resolve_callable


class FreeLogStdHead(nn.Module):
    """A policy head for Gaussian policies with ``free_log_std``: a linear layer gives the
    means, a learned vector (starting at 0) the log standard deviations, the same for every
    row; outputs ``[means, log_stds]`` as the head without the option would."""

    def __init__(self, features: int, num_outputs: int) -> None:
        super().__init__()
        if num_outputs % 2:
            raise ValueError(f"model option 'free_log_std' needs an even number of outputs "
                             f"(means and log standard deviations of a Box action space), "
                             f"got {num_outputs}: use it with Box actions only")
        self.mean = normc_init_(nn.Linear(features, num_outputs // 2), 0.01)
        self.log_std = nn.Parameter(torch.zeros(num_outputs // 2))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[means, log_stds]`` per row (the log-stds broadcast over the leading axes)."""
        means = self.mean(features)
        return torch.cat([means, self.log_std.expand_as(means)], dim=-1)


def policy_head(features: int, num_outputs: int, cfg: Mapping[str, Any]) -> nn.Module:
    """The catalog's policy head: a linear layer (RLlib's 0.01 normc init), or
    :class:`FreeLogStdHead` with ``free_log_std``."""
    if cfg["free_log_std"]:
        return FreeLogStdHead(features, num_outputs)
    return normc_init_(nn.Linear(features, num_outputs), 0.01)


class ActorCriticModel(nn.Module):
    """Default actor-critic network: ``forward(obs) -> (outputs [B, num_outputs],
    value [B])``. The value head has its own encoder unless ``vf_share_layers``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int,
                 model_config: Mapping[str, Any] | None) -> None:
        super().__init__()
        cfg = resolve_model_config(model_config)
        self.encoder, features = build_encoder(obs_space, cfg)
        self.policy_head = policy_head(features, num_outputs, cfg)
        self.value_encoder: nn.Module | None = None
        if not cfg["vf_share_layers"]:
            self.value_encoder, features = build_encoder(obs_space, cfg)
        self.value_head = normc_init_(nn.Linear(features, 1), 1.0)

    def policy_outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy outputs alone: acting without a critic skips the value encoder."""
        return self.policy_head(self.encoder(obs))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy outputs and state values for a batch of observations."""
        features = self.encoder(obs)
        outputs = self.policy_head(features)
        if self.value_encoder is not None:
            features = self.value_encoder(obs)
        return outputs, self.value_head(features).squeeze(-1)


class RecurrentModel(nn.Module):
    """Base class (and documentation) of the recurrent model interface; see the module
    docstring. Subclassing it is optional: a model with both methods is recurrent."""

    def get_initial_state(self) -> list[torch.Tensor]:
        """One env's state at an episode's start (tensors without a batch dimension)."""
        raise NotImplementedError

    def forward_rnn(self, inputs: Mapping[str, torch.Tensor], state: Sequence[torch.Tensor],
                    seq_lens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(outputs [B, T, n], values [B, T], state_out)`` for ``B`` padded sequences."""
        raise NotImplementedError

    def forward_rnn_outputs(self, inputs: Mapping[str, torch.Tensor],
                            state: Sequence[torch.Tensor], seq_lens: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_rnn``'s outputs and values without the state out (what a training
        unroll needs). Optional: a model may skip work the state out alone needs (the
        outputs at padded steps are ignored, so they may differ)."""
        outputs, values, _ = self.forward_rnn(inputs, state, seq_lens)
        return outputs, values


def is_recurrent(model: nn.Module) -> bool:
    """Whether ``model`` implements the recurrent interface."""
    return not missing_recurrent_methods(model)


def action_feature_size(action_space: gym.Space) -> int:
    """Width of the previous-action input: ``n`` (one-hot) for ``Discrete``, the flattened
    size for ``Box``."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box):
        return int(math.prod(action_space.shape))
    raise ValueError(f"model option 'lstm_use_prev_action' supports Discrete and Box action "
                     f"spaces, not {action_space!r}")


class LSTMActorCriticModel(RecurrentModel):
    """The catalog's recurrent actor-critic (``use_lstm``): encoder (MLP or conv stack, as
    :func:`build_encoder` builds for the observations), LSTM of ``lstm_cell_size`` over
    the features (with the previous action and reward when ``lstm_use_prev_action`` /
    ``lstm_use_prev_reward``), then policy and value heads on the LSTM output. Unless
    ``vf_share_layers``, the value head has its own encoder and LSTM (and state): sharing
    the LSTM, the value loss swamped the policy's gradient and StatelessCartPole did not
    learn here (RLlib always shares)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, num_outputs: int,
                 model_config: Mapping[str, Any] | None) -> None:
        super().__init__()
        cfg = resolve_model_config(model_config)
        self.encoder, features = build_encoder(obs_space, cfg)
        self.action_space = action_space
        self.use_prev_action = bool(cfg["lstm_use_prev_action"])
        self.use_prev_reward = bool(cfg["lstm_use_prev_reward"])
        in_dim = features
        if self.use_prev_action:
            in_dim += action_feature_size(action_space)
        if self.use_prev_reward:
            in_dim += 1
        self.cell_size = int(cfg["lstm_cell_size"])
        self.lstm = nn.LSTM(in_dim, self.cell_size, batch_first=True)
        self.policy_head = policy_head(self.cell_size, num_outputs, cfg)
        self.value_encoder: nn.Module | None = None
        self.value_lstm: nn.LSTM | None = None
        if not cfg["vf_share_layers"]:
            self.value_encoder, _ = build_encoder(obs_space, cfg)
            self.value_lstm = nn.LSTM(in_dim, self.cell_size, batch_first=True)
        self.value_head = normc_init_(nn.Linear(self.cell_size, 1), 1.0)
        self.paired: PairedBranches | None = None
        """Both branches stepped as one network when acting (see
        :mod:`actorrl.policy.paired_lstm`); None: stepped one after the other."""
        if self.value_lstm is not None and PairedBranches.supports(
                self.encoder, self.value_encoder, self.lstm, self.value_lstm):
            # Acting steps both small branches as one network (half the ops).
            self.paired = PairedBranches(self.encoder, self.value_encoder, self.lstm,
                                          self.value_lstm)

    def get_initial_state(self) -> list[torch.Tensor]:
        """Zero hidden and cell states, ``[lstm_cell_size]`` each (the value branch's own
        two after them unless ``vf_share_layers``)."""
        weight = self.value_head.weight
        count = 2 if self.value_lstm is None else 4
        return [weight.new_zeros(self.cell_size) for _ in range(count)]

    def _prev_action_features(self, prev_actions: torch.Tensor) -> torch.Tensor:
        if isinstance(self.action_space, gym.spaces.Discrete):
            return F.one_hot(prev_actions.long(), int(self.action_space.n)).float()
        return prev_actions.reshape(*prev_actions.shape[:2], -1).float()

    def forward_rnn(self, inputs: Mapping[str, torch.Tensor], state: Sequence[torch.Tensor],
                    seq_lens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """See :class:`RecurrentModel`."""
        return self._forward(inputs, state, seq_lens.detach().cpu())

    def forward_rnn_outputs(self, inputs: Mapping[str, torch.Tensor],
                            state: Sequence[torch.Tensor], seq_lens: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`RecurrentModel`: the LSTMs run over the padded steps too (no packing;
        an LSTM's output at a step depends only on the steps before it)."""
        outputs, values, _ = self._forward(inputs, state, None)
        return outputs, values

    def forward_step(self, obs: torch.Tensor, state: Sequence[torch.Tensor],
                     prev_actions: torch.Tensor | None = None,
                     prev_rewards: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One step of ``B`` envs (acting): ``obs`` ``[B, *obs]``, ``state`` ``[B, ...]`` per
        tensor, ``prev_actions`` / ``prev_rewards`` ``[B, ...]`` when the model reads them.
        Returns ``(outputs [B, n], values [B], state_out)``: what :meth:`forward_rnn` gives
        for sequences of length 1, without its time axis and generic inputs."""
        extra: list[torch.Tensor] = []
        if self.use_prev_action:
            assert prev_actions is not None
            extra.append(self._prev_action_features(prev_actions[:, None])[:, 0])
        if self.use_prev_reward:
            assert prev_rewards is not None
            extra.append(prev_rewards.float().reshape(-1, 1))
        if self.paired is not None and not torch.is_grad_enabled():
            state_out = self.paired.step(obs, state, extra)
            return (self.policy_head(state_out[0]), self.value_head(state_out[2]).squeeze(-1),
                    state_out)
        h, c = self._step_branch(self.encoder, self.lstm, obs, state[0], state[1], extra)
        outputs = self.policy_head(h)
        state_out = [h, c]
        if self.value_lstm is not None:
            assert self.value_encoder is not None
            h, c = self._step_branch(self.value_encoder, self.value_lstm, obs, state[2],
                                     state[3], extra)
            state_out += [h, c]
        return outputs, self.value_head(h).squeeze(-1), state_out

    @staticmethod
    def _step_branch(encoder: nn.Module, lstm: nn.LSTM, obs: torch.Tensor, h: torch.Tensor,
                     c: torch.Tensor, extra: Sequence[torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One encoder + LSTM cell step: the new ``(h, c)``, ``[B, cell]`` each."""
        x = encoder(obs)
        if extra:
            x = torch.cat([x, *extra], dim=-1)
        # The cell function, without nn.LSTM's per-call weight checks (~1.7x faster for
        # small cells; equal to float rounding).
        return torch.lstm_cell(x, (h, c), lstm.weight_ih_l0, lstm.weight_hh_l0,
                               lstm.bias_ih_l0, lstm.bias_hh_l0)

    def _forward(self, inputs: Mapping[str, torch.Tensor], state: Sequence[torch.Tensor],
                 lengths: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        out, state_out = self._branch(self.encoder, self.lstm, inputs, state[0:2], lengths)
        outputs = self.policy_head(out)
        if self.value_lstm is not None:
            assert self.value_encoder is not None
            out, value_state = self._branch(self.value_encoder, self.value_lstm, inputs,
                                            state[2:4], lengths)
            state_out += value_state
        return outputs, self.value_head(out).squeeze(-1), state_out

    def _branch(self, encoder: nn.Module, lstm: nn.LSTM, inputs: Mapping[str, torch.Tensor],
                state: Sequence[torch.Tensor], lengths: torch.Tensor | None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One encoder + LSTM over ``[B, T]`` inputs: ``(out [B, T, cell], [h, c])``; with
        ``lengths`` None the state out is the one after the last (possibly padded) step."""
        obs = inputs["obs"]
        batch, horizon = obs.shape[:2]
        features = encoder(obs.reshape(batch * horizon, *obs.shape[2:]))
        parts = [features.reshape(batch, horizon, -1)]
        if self.use_prev_action:
            parts.append(self._prev_action_features(inputs["prev_actions"]))
        if self.use_prev_reward:
            parts.append(inputs["prev_rewards"].float().reshape(batch, horizon, 1))
        x = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        return run_lstm(lstm, x, state, lengths)


def run_lstm(lstm: nn.LSTM, x: torch.Tensor, state: Sequence[torch.Tensor],
             lengths: torch.Tensor | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``lstm`` (batch first) over ``x`` ``[B, T, in]`` from ``state`` (``[h, c]``, ``[B,
    cell]`` each): ``(out [B, T, cell], [h, c])``. With ``lengths`` (``[B]``, on the CPU)
    the state out is the one after each sequence's last real step; with None, after the
    last (possibly padded) step. Outputs past a sequence's length are padding."""
    horizon = x.shape[1]
    if horizon == 1:
        # One step (acting in a worker): the cell function, without nn.LSTM's per-call
        # weight checks (~1.7x faster for small cells; equal to float rounding).
        h, c = torch.lstm_cell(x[:, 0], (state[0], state[1]), lstm.weight_ih_l0,
                               lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
        return h.unsqueeze(1), [h, c]
    h0, c0 = state[0].unsqueeze(0).contiguous(), state[1].unsqueeze(0).contiguous()
    if lengths is None or bool((lengths == horizon).all()):
        out, (h, c) = lstm(x, (h0, c0))
    else:
        # Packed: the state out is the state after each sequence's last real step.
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=False)
        packed_out, (h, c) = lstm(packed, (h0, c0))
        out, _ = nn.utils.rnn.pad_packed_sequence(packed_out, batch_first=True,
                                                  total_length=horizon)
    return out, [h[0], c[0]]


def make_model(obs_space: gym.Space, action_space: gym.Space, num_outputs: int,
               model_config: Mapping[str, Any] | None,
               default_cls: type[nn.Module] = ActorCriticModel) -> nn.Module:
    """The model catalog: ``model_config['custom_model']`` (a class or ``"pkg.module:Class"``)
    when set, else ``default_cls`` (:class:`LSTMActorCriticModel` for the default
    actor-critic under ``use_lstm``); either is called as ``cls(obs_space, action_space,
    num_outputs, model_config)`` with the resolved config. Under ``use_lstm`` the model
    must implement :class:`RecurrentModel`'s interface (ValueError naming the key)."""
    cfg = resolve_model_config(model_config)
    cls = default_cls
    if cfg["custom_model"] is not None:
        cls = resolve_callable(cfg["custom_model"], "model.custom_model")
    elif cfg["use_lstm"]:
        if default_cls is not ActorCriticModel:
            raise ValueError(f"model option 'use_lstm' is supported by the actor-critic "
                             f"policies (IMPALA, A2C, A3C), not by {default_cls.__name__}")
        cls = LSTMActorCriticModel
    model = cls(obs_space, action_space, num_outputs, cfg)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model.custom_model {cfg['custom_model']!r} built a "
                         f"{type(model).__name__}, expected a torch.nn.Module")
    missing = missing_recurrent_methods(model)
    if cfg["use_lstm"] and missing:
        raise ValueError(f"model option 'use_lstm' is set but model.custom_model "
                         f"{cfg['custom_model']!r} is not recurrent (it has no "
                         f"{', '.join(missing)}); implement RecurrentModel's interface "
                         "(actorrl.policy.models) or set use_lstm to false")
    return model
