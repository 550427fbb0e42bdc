"""The recurrent Q-network of DQN / Ape-X (``model: {use_lstm: true}``) and the unroll its
loss runs over replayed sequences.

:class:`RecurrentQNetwork` implements :class:`actorrl.policy.models.RecurrentModel`: the
encoder actorrl builds for the observations (MLP or conv stack,
:func:`~actorrl.policy.encoders.build_encoder`), an LSTM of ``lstm_cell_size`` over the
features (plus the previous action, one-hot, and the previous reward when
``lstm_use_prev_action`` / ``lstm_use_prev_reward``), then DQN's heads on the LSTM output:
an advantage head and, when ``dueling``, a value head, each with the ``hiddens`` layers,
aggregated as ``V + A - mean(A)``. Its outputs are the Q-values; its "values" are
``max_a Q`` (nothing reads them but the recurrent interface's shape).

:func:`unroll_q` runs a Q-network over a sequenced batch (see :mod:`actorrl.data.batch`) from
each sequence's stored start state, over the sequence's rows plus one more step on the
last row's ``new_obs`` (fed with the last action and reward as its previous action and
reward, as :meth:`actorrl.policy.recurrent.SequenceLayout.unroll` does for bootstrap
values). It returns the padded ``[S, T + 1, num_actions]`` Q-values, so the loss can read
each row's next-state Q-values by position (see :mod:`actorrl.policy.dqn`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.encoders import build_encoder, build_mlp
from actorrl.policy.model_config import resolve_model_config
from actorrl.policy.models import RecurrentModel, run_lstm
from actorrl.policy.recurrent import SequenceLayout, state_column_names


class RecurrentQNetwork(RecurrentModel):
    """Q(history, .) for a discrete action space: encoder, LSTM, DQN heads (see the module
    docstring). Built from the DQN policy's resolved model config and its ``hiddens`` and
    ``dueling`` settings."""

    def __init__(self, obs_space: gym.Space, num_actions: int,
                 model_config: Mapping[str, Any] | None, hiddens: Sequence[int],
                 dueling: bool) -> None:
        super().__init__()
        cfg = resolve_model_config(model_config)
        self.num_actions = int(num_actions)
        self.encoder, features = build_encoder(obs_space, cfg)
        self.use_prev_action = bool(cfg["lstm_use_prev_action"])
        self.use_prev_reward = bool(cfg["lstm_use_prev_reward"])
        in_dim = features + (self.num_actions if self.use_prev_action else 0) \
            + (1 if self.use_prev_reward else 0)
        self.cell_size = int(cfg["lstm_cell_size"])
        self.lstm = nn.LSTM(in_dim, self.cell_size, batch_first=True)
        self.advantage = build_mlp(self.cell_size, hiddens, "relu", self.num_actions)
        self.value = build_mlp(self.cell_size, hiddens, "relu", 1) if dueling else None

    def get_initial_state(self) -> list[torch.Tensor]:
        """Zero hidden and cell states, ``[lstm_cell_size]`` each."""
        weight = self.lstm.weight_hh_l0
        return [weight.new_zeros(self.cell_size), weight.new_zeros(self.cell_size)]

    def forward_rnn(self, inputs: Mapping[str, torch.Tensor], state: Sequence[torch.Tensor],
                    seq_lens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(q [B, T, num_actions], max_a q [B, T], state_out)``; see
        :class:`~actorrl.policy.models.RecurrentModel`."""
        obs = inputs[SampleBatch.OBS]
        batch, horizon = obs.shape[:2]
        features = self.encoder(obs.reshape(batch * horizon, *obs.shape[2:]))
        parts = [features.reshape(batch, horizon, -1)]
        if self.use_prev_action:
            parts.append(F.one_hot(inputs[SampleBatch.PREV_ACTIONS].long(),
                                   self.num_actions).float())
        if self.use_prev_reward:
            parts.append(inputs[SampleBatch.PREV_REWARDS].float().reshape(batch, horizon, 1))
        x = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        out, state_out = run_lstm(self.lstm, x, state, seq_lens.detach().cpu())
        advantages = self.advantage(out)
        if self.value is None:
            q = advantages
        else:
            q = self.value(out) + advantages - advantages.mean(dim=-1, keepdim=True)
        return q, q.max(dim=-1).values, state_out


def unroll_q(model: nn.Module, batch: Mapping[str, torch.Tensor]
             ) -> tuple[torch.Tensor, SequenceLayout]:
    """Q-values of ``model`` over every sequence of ``batch`` and one step more (see the
    module docstring): ``(q [S, T + 1, num_actions], layout)``, where row ``r`` of the
    batch sits at ``q[layout.row_seq[r], layout.row_t[r]]`` and sequence ``s``'s extra
    step at ``q[s, seq_lens[s]]``."""
    layout = SequenceLayout(batch[SampleBatch.SEQ_LENS])
    horizon = layout.horizon + 1
    seq_range = torch.arange(layout.num_seqs, device=layout.seq_lens.device)
    last = layout.last_rows

    def padded(rows: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
        out = layout.pad(rows, horizon)
        out[seq_range, layout.seq_lens] = tail.to(out.dtype)
        return out

    inputs = {SampleBatch.OBS: padded(batch[SampleBatch.OBS],
                                      batch[SampleBatch.NEXT_OBS][last])}
    if SampleBatch.PREV_ACTIONS in batch:
        inputs[SampleBatch.PREV_ACTIONS] = padded(batch[SampleBatch.PREV_ACTIONS],
                                                  batch[SampleBatch.ACTIONS][last])
    if SampleBatch.PREV_REWARDS in batch:
        inputs[SampleBatch.PREV_REWARDS] = padded(batch[SampleBatch.PREV_REWARDS].float(),
                                                  batch[SampleBatch.REWARDS][last])
    state = [batch[name] for name in state_column_names(batch)]
    q, _, _ = model.forward_rnn(inputs, state, layout.seq_lens + 1)
    return q, layout
