"""Actor-critic policy for A2C and A3C (and plain policy gradient with ``use_critic=False``).

Per trajectory fragment (on the rollout worker) :func:`compute_advantages` adds
``advantages`` and ``value_targets``, bootstrapping from V(``new_obs[-1]``) when the
fragment was cut or truncated by a time limit and from 0 when the episode terminated.
A recurrent policy bootstraps from the value in the state after the fragment's last step,
and its loss unrolls the model over the batch's sequences (:mod:`actorrl.policy.recurrent`).
The loss, averaged over the batch, is::

    -logp(a) * advantage + vf_loss_coeff * 0.5 * (V(s) - value_target)^2
        - entropy_coeff * entropy

Averaging (not summing, as RLlib's A3C does) keeps the step size independent of the batch
size; a count-weighted average of gradients of several batches equals the gradient on
their union.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from actorrl.data.batch import SampleBatch
from actorrl.policy.action_dist import dist_class_for
from actorrl.policy.action_masking import masked_model
from actorrl.policy.advantages import compute_advantages
from actorrl.policy.base import LossOutput, TorchPolicy
from actorrl.policy.config import ActorCriticPolicyConfig
from actorrl.policy.models import make_model
from actorrl.policy.recurrent import model_outputs, trajectory_bootstrap_value


def explained_variance(targets: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
    """1 - Var(targets - predictions) / Var(targets), floored at -1."""
    var_targets = targets.var(unbiased=False)
    ratio = (targets - predictions).var(unbiased=False) / var_targets.clamp_min(1e-8)
    return torch.clamp(1.0 - ratio, min=-1.0)


class ActorCriticPolicy(TorchPolicy):
    """A2C/A3C policy; settings in :class:`~actorrl.policy.config.ActorCriticPolicyConfig`.

    The model follows :mod:`actorrl.policy.models`' interface (``forward(obs) ->
    (dist_inputs, value)``). ``compute_actions`` stores ``action_logp``, ``vf_preds`` and
    ``action_dist_inputs``. Learner stats: ``policy_loss``, ``vf_loss``, ``entropy``,
    ``vf_explained_var``, ``total_loss`` and ``grad_gnorm`` (before clipping).
    """

    config_class = ActorCriticPolicyConfig
    config: ActorCriticPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: ActorCriticPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        self.dist_class = dist_class_for(action_space)  # make_model reads its size
        self.grad_gnorm = float("nan")
        super().__init__(observation_space, action_space, config, device)
        self.dist_class = dist_class_for(action_space, self.config.normalize_actions)

    def make_model(self) -> torch.nn.Module:
        """The catalog model with the distribution's number of outputs (masked for an
        ``action_mask`` observation: :mod:`actorrl.policy.action_masking`)."""
        num_outputs = self.dist_class.required_outputs(self.action_space)
        return masked_model(self.observation_space, self.action_space,
                            lambda space: make_model(space, self.action_space, num_outputs,
                                                     self.config.model))

    @torch.inference_mode()  # cheaper per op than no_grad; nothing here trains
    def compute_actions(self, obs: np.ndarray, explore: bool = True, *,
                        state: list[np.ndarray] | None = None,
                        prev_actions: np.ndarray | None = None,
                        prev_rewards: np.ndarray | None = None
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sampled (``explore``) or most likely actions, with logp, value and dist inputs
        (and a recurrent policy's ``state_out_*``: see :mod:`actorrl.policy.base`)."""
        self._eval_mode()
        obs_t = torch.as_tensor(obs, device=self.device)
        state_out: dict[str, np.ndarray] = {}
        if self.is_recurrent:
            dist_inputs, values, state_out = self.recurrent_step(obs_t, state, prev_actions,
                                                                 prev_rewards)
        else:
            dist_inputs, values = self.model(obs_t)
        dist = self.dist_class(dist_inputs)
        actions = dist.sample() if explore else dist.deterministic_sample()
        extras = {
            SampleBatch.ACTION_LOGP: dist.logp(actions).float().cpu().numpy(),
            SampleBatch.VF_PREDS: values.float().cpu().numpy(),
            SampleBatch.ACTION_DIST_INPUTS: dist_inputs.float().cpu().numpy(),
            **state_out,
        }
        return actions.cpu().numpy(), extras

    @torch.no_grad()
    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        """State values V(obs) for a batch of observations."""
        self._eval_mode()
        return self.model(torch.as_tensor(obs, device=self.device))[1].float().cpu().numpy()

    def _eval_mode(self) -> None:
        if self.model.training:  # eval() walks every submodule: only switch when needed
            self.model.eval()

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Add ``advantages`` and ``value_targets`` (bootstrapping as in the module doc)."""
        terminated = bool(batch[SampleBatch.TERMINATEDS][-1])
        use_critic = self.config.use_critic
        last_value = 0.0
        if not terminated and use_critic:
            if self.is_recurrent:
                self._eval_mode()
                last_value = trajectory_bootstrap_value(self.model, batch)
            else:
                last_value = float(self.compute_values(batch[SampleBatch.NEXT_OBS][-1:])[0])
        advantages, targets = compute_advantages(
            batch[SampleBatch.REWARDS],
            batch[SampleBatch.VF_PREDS] if use_critic else None,
            last_value,
            gamma=self.config.gamma,
            lambda_=self.config.lambda_,
            use_gae=self.config.use_gae,
            use_critic=use_critic,
        )
        batch[SampleBatch.ADVANTAGES] = advantages
        batch[SampleBatch.VALUE_TARGETS] = targets
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """Mean policy-gradient loss plus value loss minus entropy bonus (a sequenced
        batch: the model unrolled over its sequences; padding is never part of a mean)."""
        dist_inputs, values = model_outputs(model, batch)
        dist = self.dist_class(dist_inputs)
        logp = dist.logp(batch[SampleBatch.ACTIONS])
        advantages = batch[SampleBatch.ADVANTAGES].float()
        policy_loss = -(logp * advantages).mean()
        entropy = dist.entropy().mean()
        total = policy_loss - self.entropy_coeff * entropy
        stats: dict[str, Any] = {"policy_loss": policy_loss.detach(),
                                 "entropy": entropy.detach(),
                                 "entropy_coeff": self.entropy_coeff, "cur_lr": self.cur_lr}
        if self.config.use_critic:
            targets = batch[SampleBatch.VALUE_TARGETS].float()
            vf_loss = 0.5 * (values - targets).pow(2).mean()
            total = total + self.config.vf_loss_coeff * vf_loss
            stats["vf_loss"] = vf_loss.detach()
            stats["vf_explained_var"] = explained_variance(targets, values.detach())
        stats["total_loss"] = total.detach()
        return LossOutput(loss=total, stats=stats)

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """The base's gradients, with ``grad_gnorm`` added to the learner stats."""
        grads, info = super().compute_gradients(batch)
        info["learner_stats"]["grad_gnorm"] = float(
            np.sqrt(sum(float(np.square(g, dtype=np.float64).sum()) for g in grads)))
        return grads, info

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        """The base's SGD step, with ``grad_gnorm`` added to the learner stats."""
        info = super().learn_on_batch(batch)
        info["learner_stats"]["grad_gnorm"] = self.grad_gnorm
        return info

    def _clip_and_step(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.grad_gnorm = float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        super()._clip_and_step()
