"""Running recurrent models: acting one step at a time and unrolling recorded sequences.

A recurrent policy's model follows :class:`actorrl.policy.models.RecurrentModel`. Acting
(:func:`step_model`) runs one step of every env of a worker as ``B`` sequences of length 1
from each env's carried state. Learning (:class:`SequenceLayout`) lays a sequenced batch's
flat rows (see :mod:`actorrl.data.batch`) out as ``[S, T]`` padded sequences, unrolls the model
from each sequence's recorded start state, and gathers the real rows back, so a loss
written over flat rows masks the padding by construction.

Training losses that bootstrap from the value after a sequence's last step
(:meth:`SequenceLayout.unroll` with ``bootstrap=True``) unroll one step further: the
observation after the last step (``new_obs``) is fed at position ``seq_len`` with the last
action and reward as its previous action and reward, so the bootstrap value sees the
state the sequence ended in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.model_config import resolve_model_config


@dataclass(frozen=True)
class RecurrentInputs:
    """Which optional inputs a recurrent model reads (from its model config)."""

    prev_actions: bool
    prev_rewards: bool

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any] | None) -> RecurrentInputs:
        """``lstm_use_prev_action`` / ``lstm_use_prev_reward`` of a model config."""
        cfg = resolve_model_config(model_config)
        return cls(bool(cfg["lstm_use_prev_action"]), bool(cfg["lstm_use_prev_reward"]))


def initial_state(model: nn.Module) -> list[np.ndarray]:
    """The model's start state as float32 numpy arrays (one env's, no batch dimension)."""
    return [s.detach().float().cpu().numpy() for s in model.get_initial_state()]


def step_model(model: nn.Module, obs: torch.Tensor, state: Sequence[torch.Tensor],
               prev_actions: torch.Tensor | None, prev_rewards: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One step of ``B`` envs: ``(outputs [B, n], values [B], state_out)``. Uses the
    model's ``forward_step`` when it has one (no time axis, no ``seq_lens``), else
    ``forward_rnn`` on sequences of length 1."""
    forward_step = getattr(model, "forward_step", None)
    if forward_step is not None:
        outputs, values, state_out = forward_step(obs, state, prev_actions, prev_rewards)
        return outputs, values, list(state_out)
    inputs = {SampleBatch.OBS: obs.unsqueeze(1)}
    if prev_actions is not None:
        inputs[SampleBatch.PREV_ACTIONS] = prev_actions.unsqueeze(1)
    if prev_rewards is not None:
        inputs[SampleBatch.PREV_REWARDS] = prev_rewards.unsqueeze(1)
    seq_lens = torch.ones(obs.shape[0], dtype=torch.int64)
    outputs, values, state_out = model.forward_rnn(inputs, list(state), seq_lens)
    return outputs[:, 0], values[:, 0], list(state_out)


class SequenceLayout:
    """Where each row of a sequenced batch sits in the padded ``[S, T]`` layout.

    ``seq_lens`` ``[S]`` (a tensor); ``horizon`` is ``T`` (the longest sequence, plus one
    when unrolling with a bootstrap step).
    """

    def __init__(self, seq_lens: torch.Tensor, horizon: int | None = None) -> None:
        self.seq_lens = seq_lens.long()
        self.num_seqs = int(self.seq_lens.shape[0])
        longest = int(self.seq_lens.max()) if self.num_seqs else 0
        self.horizon = longest if horizon is None else int(horizon)
        device = self.seq_lens.device
        starts = torch.cumsum(self.seq_lens, 0) - self.seq_lens
        self.row_seq = torch.repeat_interleave(torch.arange(self.num_seqs, device=device),
                                               self.seq_lens)
        self.row_t = torch.arange(self.row_seq.shape[0], device=device) - starts[self.row_seq]
        self.last_rows = starts + self.seq_lens - 1

    def pad(self, rows: torch.Tensor, horizon: int | None = None) -> torch.Tensor:
        """``[N, ...]`` rows -> ``[S, T, ...]`` (zeros where there is no row)."""
        horizon = self.horizon if horizon is None else horizon
        out = rows.new_zeros((self.num_seqs, horizon, *rows.shape[1:]))
        out[self.row_seq, self.row_t] = rows
        return out

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """``[S, T, ...]`` -> the real rows ``[N, ...]`` (inverse of :meth:`pad`)."""
        return padded[self.row_seq, self.row_t]

    def time_major(self, rows: torch.Tensor) -> torch.Tensor:
        """``[N]`` rows -> ``[T, S]`` (zeros where there is no row)."""
        return self.pad(rows).transpose(0, 1)

    def from_time_major(self, padded: torch.Tensor) -> torch.Tensor:
        """``[T, S]`` -> the real rows ``[N]``."""
        return self.gather(padded.transpose(0, 1))

    def unroll(self, model: nn.Module, batch: Mapping[str, torch.Tensor],
               bootstrap: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Unroll ``model`` over the batch's sequences from their ``state_in_*`` columns:
        ``(outputs [N, n], values [N], bootstrap_values [S] or None)``. With ``bootstrap``
        each sequence gets one more step on ``new_obs`` of its last row (see the module
        docstring); its value is returned per sequence."""
        extra = 1 if bootstrap else 0
        horizon = self.horizon + extra
        seq_range = torch.arange(self.num_seqs, device=self.seq_lens.device)

        def padded(rows: torch.Tensor, tail: torch.Tensor | None) -> torch.Tensor:
            out = self.pad(rows, horizon)
            if tail is not None:
                out[seq_range, self.seq_lens] = tail
            return out

        last = self.last_rows if bootstrap else None
        inputs = {SampleBatch.OBS: padded(
            batch[SampleBatch.OBS],
            None if last is None else batch[SampleBatch.NEXT_OBS][last])}
        if SampleBatch.PREV_ACTIONS in batch:
            inputs[SampleBatch.PREV_ACTIONS] = padded(
                batch[SampleBatch.PREV_ACTIONS],
                None if last is None else batch[SampleBatch.ACTIONS][last].to(
                    batch[SampleBatch.PREV_ACTIONS].dtype))
        if SampleBatch.PREV_REWARDS in batch:
            inputs[SampleBatch.PREV_REWARDS] = padded(
                batch[SampleBatch.PREV_REWARDS].float(),
                None if last is None else batch[SampleBatch.REWARDS][last].float())
        state = [batch[name] for name in state_column_names(batch)]
        forward_outputs = getattr(model, "forward_rnn_outputs", None)
        if forward_outputs is not None:  # no state out needed: the model may skip packing
            outputs, values = forward_outputs(inputs, state, self.seq_lens + extra)
        else:
            outputs, values, _ = model.forward_rnn(inputs, state, self.seq_lens + extra)
        bootstrap_values = values[seq_range, self.seq_lens] if bootstrap else None
        return self.gather(outputs), self.gather(values), bootstrap_values


def model_outputs(model: nn.Module, batch: Mapping[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(outputs, values)`` of ``model`` on a training batch: unrolled over the batch's
    sequences when it has ``seq_lens`` (a recurrent model), one forward pass otherwise."""
    if SampleBatch.SEQ_LENS in batch:
        outputs, values, _ = SequenceLayout(batch[SampleBatch.SEQ_LENS]).unroll(model, batch)
        return outputs, values
    return model(batch[SampleBatch.OBS])


def state_column_names(batch: Mapping[str, Any]) -> list[str]:
    """The ``state_in_*`` keys of ``batch`` in index order."""
    prefix = SampleBatch.STATE_IN
    return sorted((k for k in batch if k.startswith(prefix)),
                  key=lambda k: int(k[len(prefix):]))


def trajectory_bootstrap_value(model: nn.Module, trajectory: SampleBatch) -> float:
    """V of ``new_obs[-1]`` in the state after a trajectory's last step. ``trajectory`` is
    one fragment before chopping (a per-row ``state_in_*`` column per state tensor): the
    model runs two steps from the last row's state input, on ``obs[-1]`` then
    ``new_obs[-1]``."""
    param = next(model.parameters())
    last = trajectory.count - 1

    def two_steps(first: np.ndarray, second: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.stack([first, second])[None], device=param.device)

    inputs = {SampleBatch.OBS: two_steps(trajectory[SampleBatch.OBS][last],
                                         trajectory[SampleBatch.NEXT_OBS][last])}
    if SampleBatch.PREV_ACTIONS in trajectory:
        prev = trajectory[SampleBatch.PREV_ACTIONS]
        inputs[SampleBatch.PREV_ACTIONS] = two_steps(
            prev[last], np.asarray(trajectory[SampleBatch.ACTIONS][last], dtype=prev.dtype))
    if SampleBatch.PREV_REWARDS in trajectory:
        prev = trajectory[SampleBatch.PREV_REWARDS]
        inputs[SampleBatch.PREV_REWARDS] = two_steps(
            prev[last], np.asarray(trajectory[SampleBatch.REWARDS][last], dtype=prev.dtype))
    state = [torch.as_tensor(trajectory[name][last][None], device=param.device)
             for name in state_column_names(trajectory)]
    with torch.no_grad():
        _, values, _ = model.forward_rnn(inputs, state, torch.tensor([2]))
    return float(values[0, 1])
