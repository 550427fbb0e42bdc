"""APPO policy: IMPALA's actor-critic trained with PPO's clipped surrogate (RLlib's APPO).

The learner keeps an *old policy*, a target copy of the model synced from the learner's
model every ``target_update_period`` updates (``num_sgd_iter * minibatch_buffer_size`` by
default: once the batches the learner cycles through have all been served). Per row, with
``pi`` the learner policy, ``mu`` the behaviour policy that sampled the action and
``pi_old`` the old policy:

``vtrace: true`` (default)
    V-trace runs with ``pi_old`` as its target policy (``log_rho = log pi_old - log mu``)
    and gives the value targets ``vs`` and the advantages ``A``. The ratio is
    ``clip(mu / pi_old, 0, 2) * pi / mu`` (``pi / pi_old`` while the behaviour policy is not
    far off), and the KL term is ``KL(pi_old || pi)``.
``vtrace: false``
    Advantages and value targets are GAE (``lambda``) computed on the rollout worker; the
    ratio is ``pi / mu`` and the KL term is ``KL(mu || pi)``.

Loss (means over the batch's rows)::

    -min(A * ratio, A * clip(ratio, 1 - clip_param, 1 + clip_param))
        + vf_loss_coeff * 0.5 * (V(s) - vs)^2 - entropy_coeff * entropy
        [+ kl_coeff * KL  with use_kl_loss]

With ``use_kl_loss``, ``kl_coeff`` adapts at every target sync to the mean KL of the
updates since the previous one (x1.5 above ``2 kl_target``, x0.5 below ``kl_target / 2``).
The batch layout is IMPALA's (:mod:`actorrl.policy.impala`); recurrent models unroll the
old policy over the same sequences.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.actor_critic import explained_variance
from actorrl.policy.advantages import compute_advantages
from actorrl.policy.base import LossOutput
from actorrl.policy.config import APPOPolicyConfig
from actorrl.policy.impala import ImpalaPolicy, TrainForward
from actorrl.policy.recurrent import trajectory_bootstrap_value
from actorrl.policy.surrogate import clipped_surrogate, updated_kl_coeff


class APPOPolicy(ImpalaPolicy):
    """APPO: see the module docstring. Learner stats add ``kl``, ``KL_Coeff`` and
    ``num_target_updates`` to IMPALA's."""

    config_class = APPOPolicyConfig
    config: APPOPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: APPOPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        super().__init__(observation_space, action_space, config, device)
        self.kl_coeff = float(self.config.kl_coeff)
        """The KL term's weight now (adapted with ``use_kl_loss``)."""
        self.num_target_updates = 0
        # Built on first use: rollout workers never learn, so never hold an old policy.
        self._targets: dict[torch.device, nn.Module] = {}
        self._kl_sum = 0.0
        self._kl_count = 0
        # (obs tensor, old-policy version) -> old-policy outputs: the learner serves each
        # batch num_sgd_iter times, mostly under one old policy, so the old policy's
        # forward pass runs once per batch and version. Holding the obs tensor keeps its
        # memory from being reused by another batch while the entry lives.
        self._old_outputs: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = \
            OrderedDict()

    # ---- the old (target) policy -----------------------------------------------------
    def target_model(self, model: nn.Module) -> nn.Module:
        """The old policy on ``model``'s device (one copy per tower device)."""
        device = next(model.parameters()).device
        target = self._targets.get(device)
        if target is None:
            source = next(iter(self._targets.values()), self.model)
            target = copy.deepcopy(source).to(device)
            target.requires_grad_(False)
            target.eval()
            self._targets[device] = target
        return target

    def update_target(self) -> None:
        """Copy the learner's model into every old-policy copy."""
        self._old_outputs.clear()
        with torch.no_grad():
            for target in self._targets.values():
                target.load_state_dict(self.model.state_dict())
        self.num_target_updates += 1

    def after_update(self, num_updates: int) -> None:
        """Sync the old policy every ``target_update_period`` updates; with
        ``use_kl_loss`` adapt ``kl_coeff`` to the mean KL since the last sync."""
        if num_updates % self.config.target_update_period:
            return
        self.update_target()
        if self.config.use_kl_loss and self._kl_count:
            self.kl_coeff = updated_kl_coeff(self.kl_coeff, self._kl_sum / self._kl_count,
                                             self.config.kl_target)
        self._kl_sum, self._kl_count = 0.0, 0

    def _old_policy_outputs(self, model: nn.Module, batch: dict[str, torch.Tensor],
                            forward: TrainForward) -> torch.Tensor:
        """The old policy's action-distribution inputs on the batch's rows (cached per
        observation tensor and old-policy version for feed-forward models)."""
        target = self.target_model(model)
        with torch.no_grad():
            if forward.layout is not None:
                return forward.layout.unroll(target, batch)[0]
            obs = batch[SampleBatch.OBS]
            key = (obs.device, obs.data_ptr(), tuple(obs.shape), obs.stride(),
                   self.num_target_updates)
            cached = self._old_outputs.get(key)
            if cached is not None and cached[0].data_ptr() == obs.data_ptr():
                self._old_outputs.move_to_end(key)
                return cached[1]
            policy_outputs = getattr(target, "policy_outputs", None)
            outputs = policy_outputs(obs) if policy_outputs is not None else target(obs)[0]
            self._old_outputs[key] = (obs, outputs)
            # One entry per batch the learner cycles through, and one to spare.
            while len(self._old_outputs) > self.config.minibatch_buffer_size + 1:
                self._old_outputs.popitem(last=False)
            return outputs

    # ---- acting and postprocessing (GAE with vtrace: false) ---------------------------
    def compute_actions(self, obs: np.ndarray, explore: bool = True, *,
                        state: list[np.ndarray] | None = None,
                        prev_actions: np.ndarray | None = None,
                        prev_rewards: np.ndarray | None = None
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """IMPALA's actions; with ``vtrace: false`` also ``vf_preds`` (GAE needs them)."""
        if self.config.vtrace:
            return super().compute_actions(obs, explore, state=state,
                                           prev_actions=prev_actions,
                                           prev_rewards=prev_rewards)
        obs_t = torch.as_tensor(np.asarray(obs), device=self.device)
        state_out: dict[str, np.ndarray] = {}
        with torch.inference_mode():
            if self.is_recurrent:
                dist_inputs, values, state_out = self.recurrent_step(
                    obs_t, state, prev_actions, prev_rewards)
            else:
                dist_inputs, values = self.model(obs_t)
            dist = self.dist_class(dist_inputs)
            actions = dist.sample() if explore else dist.deterministic_sample()
            logp = dist.logp(actions)
        self.global_timestep += len(actions)
        return actions.cpu().numpy(), {
            SampleBatch.ACTION_LOGP: logp.float().cpu().numpy(),
            SampleBatch.ACTION_DIST_INPUTS: dist_inputs.float().cpu().numpy(),
            SampleBatch.VF_PREDS: values.float().cpu().numpy(),
            **state_out,
        }

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """With ``vtrace: false``: GAE ``advantages`` and ``value_targets`` per trajectory
        fragment, bootstrapping from V(``new_obs[-1]``) unless it terminated."""
        cfg = self.config
        if cfg.vtrace:
            return batch
        last_value = 0.0
        if not bool(batch[SampleBatch.TERMINATEDS][-1]) and cfg.use_critic:
            with torch.inference_mode():
                if self.is_recurrent:
                    last_value = trajectory_bootstrap_value(self.model, batch)
                else:
                    next_obs = torch.as_tensor(batch[SampleBatch.NEXT_OBS][-1:],
                                               device=self.device)
                    last_value = float(self.model(next_obs)[1][0])
        advantages, targets = compute_advantages(
            batch[SampleBatch.REWARDS], batch[SampleBatch.VF_PREDS] if cfg.use_critic else None,
            last_value, gamma=cfg.gamma, lambda_=cfg.lambda_, use_gae=cfg.use_gae,
            use_critic=cfg.use_critic)
        batch[SampleBatch.ADVANTAGES] = advantages
        batch[SampleBatch.VALUE_TARGETS] = targets
        return batch

    # ---- the loss ------------------------------------------------------------------
    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The clipped-surrogate loss of the module docstring."""
        cfg = self.config
        forward = self.forward_train(model, batch)
        logp, entropy, behaviour_logp, terminated, ends = self._logps_and_ends(
            batch, forward.dist_inputs)
        dist = self.dist_class(forward.dist_inputs)
        stats: dict[str, Any] = {}
        if cfg.vtrace:
            old_dist = self.dist_class(self._old_policy_outputs(model, batch, forward))
            with torch.no_grad():
                old_logp = old_dist.logp(batch[SampleBatch.ACTIONS])
                vs, advantages = self.vtrace_targets(
                    model, batch, forward, old_logp - behaviour_logp, terminated, ends)
                is_ratio = torch.clamp(torch.exp(behaviour_logp - old_logp), 0.0, 2.0)
            ratio = is_ratio * torch.exp(logp - behaviour_logp)
            kl = old_dist.kl(dist)
            stats["mean_IS"] = is_ratio.mean().detach()
            stats["var_IS"] = is_ratio.var(unbiased=False).detach()
        else:
            behaviour_dist = self.dist_class(batch[SampleBatch.ACTION_DIST_INPUTS].float())
            advantages = batch[SampleBatch.ADVANTAGES].float()
            vs = batch[SampleBatch.VALUE_TARGETS].float()
            ratio = torch.exp(logp - behaviour_logp)
            kl = behaviour_dist.kl(dist)
        policy_loss = -clipped_surrogate(advantages, ratio, cfg.clip_param).mean()
        values = forward.values
        vf_loss = 0.5 * (values - vs).pow(2).mean()
        mean_entropy = entropy.mean()
        mean_kl = kl.mean()
        total = policy_loss - self.entropy_coeff * mean_entropy
        if cfg.vtrace or cfg.use_critic:
            total = total + cfg.vf_loss_coeff * vf_loss
        if cfg.use_kl_loss:
            total = total + self.kl_coeff * mean_kl
        with torch.no_grad():
            kl_value = float(mean_kl)
            var_gnorm = torch.sqrt(sum(p.detach().pow(2).sum() for p in model.parameters()))
        self._kl_sum += kl_value
        self._kl_count += 1
        stats.update({
            "total_loss": total.detach(),
            "policy_loss": policy_loss.detach(),
            "vf_loss": vf_loss.detach(),
            "entropy": mean_entropy.detach(),
            "entropy_coeff": self.entropy_coeff,
            "kl": kl_value,
            "KL_Coeff": self.kl_coeff,
            "var_gnorm": var_gnorm,
            "vf_explained_var": explained_variance(vs, values.detach()),
            "cur_lr": self.optimizer.param_groups[0]["lr"],
            "num_target_updates": self.num_target_updates,
        })
        return LossOutput(loss=total, stats=stats)

    # ---- state -----------------------------------------------------------------------
    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load weights; the old policy becomes the loaded one too (a restored or
        broadcast policy starts its surrogate from itself)."""
        super().set_weights(weights)
        if self._targets:
            self.update_target()

    def get_state(self) -> dict[str, Any]:
        """The base's state plus the old policy's weights, ``kl_coeff`` and the sync
        count."""
        state = super().get_state()
        target = self.target_model(self.model)
        state["target_weights"] = {k: v.detach().cpu().numpy().copy()
                                   for k, v in target.state_dict().items()}
        state["kl_coeff"] = self.kl_coeff
        state["num_target_updates"] = self.num_target_updates
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned (the old policy included)."""
        super().set_state(state)
        target_weights = state.get("target_weights")
        if target_weights is not None:
            loaded = {k: torch.as_tensor(np.asarray(v)) for k, v in target_weights.items()}
            for target in [self.target_model(self.model), *self._targets.values()]:
                target.load_state_dict(loaded)
        self.kl_coeff = float(state.get("kl_coeff", self.config.kl_coeff))
        self.num_target_updates = int(state.get("num_target_updates", 0))
