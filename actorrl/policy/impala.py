"""IMPALA policy: an actor-critic trained with V-trace off-policy corrections.

Batch layout (what the loss needs from the learner's train batch)
    The rows of each trajectory (one env's consecutive steps) must be contiguous and in
    time order; trajectories may be concatenated in any order and be of any length. The
    rollout worker's ``truncate_episodes`` batches (grouped by env, ``rollout_fragment_length``
    steps each) and concatenations of them satisfy this. A trajectory ends at a row that is
    terminated or truncated, where ``eps_id`` changes, where ``t`` (when present) does not
    advance by one, or at the end of the batch.

    The loss cuts the batch by position into sequences of ``rollout_fragment_length`` rows
    (the last one shorter when the count is not a multiple; it is padded and masked) and
    lays them out time-major ``[T, B]``. A sequence may hold several trajectories; it never
    mixes them: at every row that ends a trajectory or a sequence the trace is cut
    (discount 0) and the row's bootstrap ``gamma * V(new_obs)`` is folded into its reward,
    or nothing when it terminated. That equals V-trace with ``bootstrap_value =
    V(new_obs_last)`` at sequence ends, and also bootstraps time-limit truncations and
    fragment cuts inside a sequence correctly.

Loss (means over the batch rows; RLlib sums, which only rescales the gradient before
``grad_clip``)::

    -logp(a) * pg_advantage + vf_loss_coeff * 0.5 * (V(s) - v_s)^2 - entropy_coeff * entropy
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.action_dist import dist_class_for
from actorrl.policy.action_masking import masked_model
from actorrl.policy.advantages import vtrace_from_importance_weights
from actorrl.policy.base import LossOutput, TorchPolicy
from actorrl.policy.config import ImpalaPolicyConfig
from actorrl.policy.models import make_model
from actorrl.policy.recurrent import SequenceLayout


def trajectory_ends(terminateds: torch.Tensor, truncateds: torch.Tensor | None,
                    eps_id: torch.Tensor | None, t: torch.Tensor | None) -> torch.Tensor:
    """Bool ``[N]``: rows after which the next row does not continue the same trajectory
    (terminated, truncated, ``eps_id`` changes, ``t`` does not advance by one, last row)."""
    ends = terminateds.bool().clone()
    if truncateds is not None:
        ends |= truncateds.bool()
    if eps_id is not None:
        ends[:-1] |= eps_id[1:] != eps_id[:-1]
    if t is not None:
        ends[:-1] |= t[1:] != t[:-1] + 1
    ends[-1] = True
    return ends


def to_time_major(x: torch.Tensor, horizon: int) -> torch.Tensor:
    """``[N]`` -> ``[T, B]`` with ``B = ceil(N / T)``: row ``b * T + t`` goes to ``[t, b]``;
    the missing rows of the last sequence are zeros."""
    num_seqs = -(-x.shape[0] // horizon)
    padded = x.new_zeros(num_seqs * horizon)
    padded[: x.shape[0]] = x
    return padded.view(num_seqs, horizon).t()


def from_time_major(x: torch.Tensor, count: int) -> torch.Tensor:
    """Inverse of :func:`to_time_major`: ``[T, B]`` -> ``[count]``."""
    return x.t().reshape(-1)[:count]


@dataclass
class TrainForward:
    """A model's outputs on a train batch's rows: action-distribution inputs and values
    (with gradients); for a sequenced batch also its layout and the value after each
    sequence's last step."""

    dist_inputs: torch.Tensor
    values: torch.Tensor
    layout: SequenceLayout | None = None
    bootstrap: torch.Tensor | None = None


class ImpalaPolicy(TorchPolicy):
    """IMPALA actor-critic: acts by sampling its action distribution, learns with V-trace.

    See the module docstring for the batch layout the loss requires. ``compute_actions``
    returns ``action_logp`` and ``action_dist_inputs`` (the behaviour policy's outputs).
    """

    config_class = ImpalaPolicyConfig
    config: ImpalaPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: ImpalaPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        self.dist_class = dist_class_for(action_space)  # make_model reads its size
        super().__init__(observation_space, action_space, config, device)
        self.dist_class = dist_class_for(action_space, self.config.normalize_actions)

    @property
    def impala_config(self) -> ImpalaPolicyConfig:
        """The policy's config (``self.config``)."""
        return self.config

    def make_model(self) -> nn.Module:
        """The catalog's actor-critic model (or ``model.custom_model``): ``forward(obs) ->
        (action_dist_inputs, value)``, masked for an ``action_mask`` observation
        (:mod:`actorrl.policy.action_masking`)."""
        num_outputs = self.dist_class.required_outputs(self.action_space)
        return masked_model(self.observation_space, self.action_space,
                            lambda space: make_model(space, self.action_space, num_outputs,
                                                     self.config.model))

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """Adam, or RMSProp with ``decay``, ``momentum`` and ``epsilon`` (``opt_type``)."""
        cfg = self.config
        if cfg.opt_type == "rmsprop":
            return torch.optim.RMSprop(model.parameters(), lr=cfg.lr, alpha=cfg.decay,
                                       momentum=cfg.momentum, eps=cfg.epsilon, foreach=True)
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, foreach=True)

    def compute_actions(self, obs: np.ndarray, explore: bool = True, *,
                        state: list[np.ndarray] | None = None,
                        prev_actions: np.ndarray | None = None,
                        prev_rewards: np.ndarray | None = None
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sampled actions (the mode when ``explore`` is false), with ``action_logp`` and
        ``action_dist_inputs`` (and a recurrent policy's ``state_out_*``: see
        :mod:`actorrl.policy.base`)."""
        obs_t = torch.as_tensor(np.asarray(obs), device=self.device)
        state_out: dict[str, np.ndarray] = {}
        with torch.inference_mode():  # cheaper per op than no_grad; nothing here trains
            if self.is_recurrent:
                dist_inputs, _, state_out = self.recurrent_step(obs_t, state, prev_actions,
                                                                prev_rewards)
            else:
                # Acting needs no value: models that can (the default one) skip their critic.
                policy_outputs = getattr(self.model, "policy_outputs", None)
                dist_inputs = (policy_outputs(obs_t) if policy_outputs is not None
                               else self.model(obs_t)[0])
            dist = self.dist_class(dist_inputs)
            actions = dist.sample() if explore else dist.deterministic_sample()
            logp = dist.logp(actions)
        self.global_timestep += len(actions)
        return actions.cpu().numpy(), {
            SampleBatch.ACTION_LOGP: logp.cpu().numpy().astype(np.float32),
            SampleBatch.ACTION_DIST_INPUTS: dist_inputs.cpu().numpy().astype(np.float32),
            **state_out,
        }

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The V-trace actor-critic loss on ``batch`` (layout: see the module docstring)."""
        forward = self.forward_train(model, batch)
        target_logp, entropy, behaviour_logp, terminated, ends = self._logps_and_ends(
            batch, forward.dist_inputs)
        log_rhos = target_logp.detach() - behaviour_logp
        vs, pg_advantages = self.vtrace_targets(model, batch, forward, log_rhos, terminated,
                                                ends)
        return self._loss_output(model, target_logp, entropy, forward.values, vs,
                                 pg_advantages, log_rhos)

    def forward_train(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TrainForward:
        """The model's outputs on every row of a train batch: a sequenced batch is unrolled
        from each sequence's start state, one step further for the bootstrap value."""
        if SampleBatch.SEQ_LENS not in batch:
            dist_inputs, values = model(batch[SampleBatch.OBS])
            return TrainForward(dist_inputs, values)
        layout = SequenceLayout(batch[SampleBatch.SEQ_LENS])
        dist_inputs, values, bootstrap = layout.unroll(model, batch, bootstrap=True)
        assert bootstrap is not None
        return TrainForward(dist_inputs, values, layout, bootstrap)

    def vtrace_targets(self, model: nn.Module, batch: dict[str, torch.Tensor],
                       forward: TrainForward, log_rhos: torch.Tensor, terminated: torch.Tensor,
                       ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V-trace value targets ``vs`` and policy-gradient advantages per row (no
        gradients), from the log importance ratios ``log_rhos`` (target over behaviour
        policy; ignored with ``vtrace: false``). At every row that ends a trajectory or a
        sequence the trace is cut and the row's bootstrap value folded into its reward."""
        cfg = self.config
        values = forward.values
        with torch.no_grad():
            ends = ends.clone()
            next_values = torch.zeros_like(values)
            layout = forward.layout
            if layout is None:
                count = values.shape[0]
                horizon = cfg.rollout_fragment_length
                rows = torch.arange(count, device=values.device)
                ends |= (rows % horizon) == horizon - 1
                bootstrap_rows = torch.nonzero(ends & ~terminated).squeeze(1)
                if len(bootstrap_rows) > 0:
                    bootstrap_obs = batch[SampleBatch.NEXT_OBS][bootstrap_rows]
                    next_values[bootstrap_rows] = model(bootstrap_obs)[1]

                def time_major(x: torch.Tensor) -> torch.Tensor:
                    return to_time_major(x, horizon)

                def flat(x: torch.Tensor) -> torch.Tensor:
                    return from_time_major(x, count)

                num_seqs = -(-count // horizon)
            else:
                # Inside a sequence a trajectory ends only at a terminal row (sequences are
                # cut from one episode's fragment); its last row bootstraps from the
                # unrolled value.
                assert forward.bootstrap is not None
                ends[layout.last_rows] = True
                next_values[layout.last_rows] = forward.bootstrap.detach()
                next_values = torch.where(terminated, torch.zeros_like(next_values),
                                          next_values)
                time_major, flat, num_seqs = (layout.time_major, layout.from_time_major,
                                              layout.num_seqs)
            rewards = batch[SampleBatch.REWARDS].float()
            rewards = torch.where(ends, rewards + cfg.gamma * next_values, rewards)
            discounts = torch.where(ends, torch.zeros_like(rewards),
                                    torch.full_like(rewards, cfg.gamma))
            if not cfg.vtrace:  # importance ratios taken as 1: on-policy n-step targets
                log_rhos = torch.zeros_like(log_rhos)
            vtrace = vtrace_from_importance_weights(
                log_rhos=time_major(log_rhos),
                discounts=time_major(discounts),
                rewards=time_major(rewards),
                values=time_major(values.detach()),
                bootstrap_value=values.new_zeros(num_seqs),
                clip_rho_threshold=cfg.vtrace_clip_rho_threshold,
                clip_pg_rho_threshold=cfg.vtrace_clip_pg_rho_threshold,
            )
            return flat(vtrace.vs), flat(vtrace.pg_advantages)

    def _logps_and_ends(self, batch: dict[str, torch.Tensor], dist_inputs: torch.Tensor
                        ) -> tuple[torch.Tensor, ...]:
        """What both losses start from: the learner policy's log-probabilities of the taken
        actions and its entropies (with gradients), the behaviour policy's log-probabilities,
        the terminal rows and the rows where a trajectory ends (without)."""
        dist = self.dist_class(dist_inputs)
        actions = batch[SampleBatch.ACTIONS]
        target_logp = dist.logp(actions)
        entropy = dist.entropy()
        with torch.no_grad():
            behaviour_logp = self._behaviour_logp(batch, actions)
            terminated = batch[SampleBatch.TERMINATEDS].bool()
            ends = trajectory_ends(terminated, batch.get(SampleBatch.TRUNCATEDS),
                                   batch.get(SampleBatch.EPS_ID), batch.get(SampleBatch.T))
        return target_logp, entropy, behaviour_logp, terminated, ends

    def _behaviour_logp(self, batch: dict[str, torch.Tensor], actions: torch.Tensor
                        ) -> torch.Tensor:
        """The sampling policy's log-probabilities of ``actions``: recorded, or recomputed
        from the recorded distribution inputs."""
        if SampleBatch.ACTION_LOGP in batch:
            return batch[SampleBatch.ACTION_LOGP].float()
        return self.dist_class(batch[SampleBatch.ACTION_DIST_INPUTS].float()).logp(actions)

    def _loss_output(self, model: nn.Module, target_logp: torch.Tensor,
                     entropy: torch.Tensor, values: torch.Tensor, vs: torch.Tensor,
                     pg_advantages: torch.Tensor, log_rhos: torch.Tensor) -> LossOutput:
        cfg = self.config
        pi_loss = -(target_logp * pg_advantages).mean()
        vf_loss = 0.5 * (values - vs).pow(2).mean()
        mean_entropy = entropy.mean()
        total = pi_loss + cfg.vf_loss_coeff * vf_loss - self.entropy_coeff * mean_entropy

        with torch.no_grad():
            rhos = log_rhos.exp()
            var_gnorm = torch.sqrt(sum(p.detach().pow(2).sum() for p in model.parameters()))
            explained_var = 1.0 - torch.var(vs - values.detach()) / torch.var(vs).clamp_min(
                1e-8)
        stats = {
            "total_loss": total.detach(),
            "policy_loss": pi_loss.detach(),
            "vf_loss": vf_loss.detach(),
            "entropy": mean_entropy.detach(),
            "entropy_coeff": self.entropy_coeff,
            "mean_IS": rhos.mean(),
            "var_IS": rhos.var(unbiased=False),
            "var_gnorm": var_gnorm,
            "vf_explained_var": explained_var,
            "cur_lr": self.optimizer.param_groups[0]["lr"],
        }
        return LossOutput(loss=total, stats=stats)
