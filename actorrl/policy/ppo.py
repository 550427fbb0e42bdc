"""PPO policy (RLlib's PPO semantics): an actor-critic policy with the clipped surrogate
objective, a clamped value loss and an adaptive KL penalty.

Sampling and postprocessing are :class:`~actorrl.policy.actor_critic.ActorCriticPolicy`'s:
``compute_actions`` records ``action_logp``, ``vf_preds`` and ``action_dist_inputs``; each
trajectory fragment gets GAE ``advantages`` and ``value_targets`` (``lambda``, ``gamma``,
bootstrapping from V of the last ``new_obs`` unless the episode terminated). The learner
standardises the advantages over the whole train batch and runs minibatch SGD epochs
(:meth:`actorrl.learner.actor.LearnerActor.learn_on_train_batch`). The loss of one
minibatch, all means over its rows (a recurrent policy's rows are its sequences' real
steps, so padding is never averaged)::

    ratio     = exp(logp(a) - action_logp)
    surrogate = min(A * ratio, A * clip(ratio, 1 - clip_param, 1 + clip_param))
    vf_loss   = clamp((V(s) - value_target)^2, 0, vf_clip_param)
    total     = mean(-surrogate + vf_loss_coeff * vf_loss - entropy_coeff * entropy)
                + kl_coeff * mean(KL(behaviour || current))   (when kl_coeff > 0)

After each train step the learner adapts ``kl_coeff`` (:meth:`PPOPolicy.update_kl`) from
the step's mean KL; the coefficient is part of the policy's checkpoint state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import torch

from actorrl.data.batch import SampleBatch
from actorrl.policy.actor_critic import ActorCriticPolicy, explained_variance
from actorrl.policy.base import LossOutput
from actorrl.policy.config import PPOPolicyConfig
from actorrl.policy.recurrent import model_outputs
from actorrl.policy.surrogate import clipped_surrogate, updated_kl_coeff


class PPOPolicy(ActorCriticPolicy):
    """PPO policy; settings in :class:`~actorrl.policy.config.PPOPolicyConfig`.

    Learner stats (RLlib's names): ``total_loss``, ``policy_loss``, ``vf_loss``,
    ``vf_explained_var``, ``kl``, ``entropy``, ``entropy_coeff``, ``cur_kl_coeff``,
    ``cur_lr``. ``kl`` is measured whether or not the loss has the KL term.
    """

    config_class = PPOPolicyConfig
    config: PPOPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: PPOPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        super().__init__(observation_space, action_space, config, device)
        self.kl_coeff: float = float(self.config.kl_coeff)
        """The current weight of the KL term (adapted by :meth:`update_kl`)."""

    @property
    def uses_kl_loss(self) -> bool:
        """Whether the loss has the KL term now (``use_kl_loss`` and ``kl_coeff > 0``)."""
        return self.config.use_kl_loss and self.kl_coeff > 0.0

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The PPO loss of the module docstring on ``batch`` (one minibatch)."""
        dist_inputs, values = model_outputs(model, batch)
        dist = self.dist_class(dist_inputs)
        behaviour = self.dist_class(batch[SampleBatch.ACTION_DIST_INPUTS].float())
        logp = dist.logp(batch[SampleBatch.ACTIONS])
        ratio = torch.exp(logp - batch[SampleBatch.ACTION_LOGP].float())
        advantages = batch[SampleBatch.ADVANTAGES].float()
        surrogate = clipped_surrogate(advantages, ratio, self.config.clip_param)
        mean_kl = behaviour.kl(dist).mean()
        entropy = dist.entropy()
        cfg = self.config
        if cfg.use_critic:
            targets = batch[SampleBatch.VALUE_TARGETS].float()
            vf_loss = torch.clamp((values - targets).pow(2), 0.0, cfg.vf_clip_param)
        else:
            vf_loss = torch.zeros_like(surrogate)
        total = (-surrogate + cfg.vf_loss_coeff * vf_loss
                 - self.entropy_coeff * entropy).mean()
        if self.uses_kl_loss:
            total = total + self.kl_coeff * mean_kl
        stats: dict[str, Any] = {
            "total_loss": total.detach(),
            "policy_loss": (-surrogate).mean().detach(),
            "vf_loss": vf_loss.mean().detach(),
            "kl": mean_kl.detach(),
            "entropy": entropy.mean().detach(),
            "entropy_coeff": self.entropy_coeff,
            "cur_kl_coeff": self.kl_coeff,
            "cur_lr": self.cur_lr,
        }
        if cfg.use_critic:
            stats["vf_explained_var"] = explained_variance(targets, values.detach())
        return LossOutput(loss=total, stats=stats)

    def update_kl(self, sampled_kl: float) -> float:
        """Adapt ``kl_coeff`` to the KL measured over a train step (RLlib's rule, see
        :func:`~actorrl.policy.surrogate.updated_kl_coeff`); returns the new value."""
        self.kl_coeff = updated_kl_coeff(self.kl_coeff, float(sampled_kl),
                                         self.config.kl_target)
        return self.kl_coeff

    def get_state(self) -> dict[str, Any]:
        """The base state plus the adapted ``kl_coeff``."""
        return {**super().get_state(), "kl_coeff": self.kl_coeff}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output (``kl_coeff`` included)."""
        super().set_state(state)
        if "kl_coeff" in state:
            self.kl_coeff = float(state["kl_coeff"])
