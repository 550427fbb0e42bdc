"""DDPG and TD3 (RLlib's ``DDPGTorchPolicy``): a deterministic tanh actor acting in
[-1, 1], one or two Q networks over ``(obs, action)``, target networks of both that
follow softly, and noise exploration (:mod:`actorrl.policy.noise`).

Read top to bottom: the networks, acting, the loss, the update.

Actions
    The actor's ``tanh`` output is the action in [-1, 1]; the rollout worker maps it onto
    the Box's bounds before ``env.step`` (``normalize_actions``) and the batch keeps the
    policy's own action, which the Q networks read. Target smoothing and the exploration
    noise act in that space too.

The loss (RLlib's, per row)
    ``a' = pi_target(s')``, with ``smooth_target_policy`` ``clip(a' + clip(N(0,
    target_noise), -target_noise_clip, target_noise_clip), -1, 1)``; the target ``y = r +
    gamma ** n * (1 - terminated) * min_i Q_target_i(s', a')`` (the minimum over the twins
    with ``twin_q``); the critic loss ``mean(weights * sum_i l(Q_i(s, a) - y))`` with ``l``
    Huber (``use_huber``) or ``0.5 x ** 2``; the actor loss ``-mean(Q_1(s, pi(s)))``; each
    plus ``l2_reg`` times half the sum of its network's squared weights (not biases).
    ``td_error`` is the first Q network's ``Q_1(s, a) - y``.

One optimizer, two parameter groups
    RLlib's two Adams (``actor_lr``, ``critic_lr``; epsilon 1e-7) are one Adam with an
    ``actor`` and a ``critic`` group: the actor's loss reaches the actor only (the Q
    network is evaluated with detached parameters), the critic's the Q networks only, so
    one backward pass gives each group its own loss's gradient. ``grad_clip`` clips each
    group on its own. The actor steps on every ``policy_delay``-th update (the first
    included): on the others its gradients are dropped before the step, so Adam leaves its
    parameters and moments as they are, as RLlib skips the actor's optimizer.

Target networks
    :class:`~actorrl.policy.continuous_q.SoftTargetPolicy`: actor and Q targets move by
    ``tau`` once ``target_network_update_freq`` rows were trained since the last update
    (after every update by default, whatever ``policy_delay`` is, as RLlib).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.base import LossOutput
from actorrl.policy.continuous_q import (
    ADAM_EPSILON,
    QNetwork,
    SoftTargetPolicy,
    build_xavier_mlp,
    detached_call,
    min_q,
    observation_encoder,
    on_target,
)
from actorrl.policy.ddpg_config import ApexDDPGPolicyConfig, DDPGPolicyConfig, TD3PolicyConfig
from actorrl.policy.dqn import N_STEPS, adjust_nstep, huber_loss
from actorrl.policy.noise import NoiseExploration, apex_scale

ACTOR, CRITIC = "actor", "critic"
"""The optimizer's parameter groups, by ``name``."""


class DDPGModel(nn.Module):
    """The actor (``policy``: observation -> action in [-1, 1]) and the Q network(s)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space,
                 config: DDPGPolicyConfig) -> None:
        super().__init__()
        self.action_dim = int(np.prod(action_space.shape))
        encoder, features = observation_encoder(obs_space, config.model)
        self.policy = nn.Sequential(
            encoder, build_xavier_mlp(features, list(config.actor_hiddens),
                                      config.actor_hidden_activation, self.action_dim),
            nn.Tanh())
        net = {"fcnet_hiddens": list(config.critic_hiddens),
               "fcnet_activation": config.critic_hidden_activation}
        self.q = QNetwork(obs_space, config.model, net, self.action_dim, None)
        self.twin_q = (QNetwork(obs_space, config.model, net, self.action_dim, None)
                       if config.twin_q else None)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic actions ``[B, action_dim]`` in [-1, 1]."""
        return self.policy(obs)

    def q_networks(self) -> list[nn.Module]:
        """The Q network and, with ``twin_q``, the twin."""
        return [self.q] if self.twin_q is None else [self.q, self.twin_q]


def l2_weights(module: nn.Module) -> torch.Tensor:
    """Half the sum of the squared weights of ``module`` (biases left out)."""
    terms = [0.5 * p.pow(2).sum() for name, p in module.named_parameters()
             if "bias" not in name]
    return torch.stack(terms).sum()


class DDPGPolicy(SoftTargetPolicy):
    """DDPG / TD3 for float ``Box`` action spaces; see the module docstring and
    :class:`~actorrl.policy.ddpg_config.DDPGPolicyConfig`."""

    config_class = DDPGPolicyConfig
    config: DDPGPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: DDPGPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        if not (isinstance(action_space, gym.spaces.Box)
                and np.issubdtype(action_space.dtype, np.floating)):
            raise ValueError(f"action space {action_space} is not supported by DDPG/TD3: "
                             "a deterministic policy needs a float Box action space; for "
                             "Discrete actions use DQN or SAC")
        super().__init__(observation_space, action_space, config, device)
        self.init_targets()
        cfg = self.config
        self._rng = np.random.default_rng(None if cfg.seed is None
                                          else [cfg.seed, cfg.worker_index])
        fixed = apex_scale(cfg.worker_index, cfg.num_workers) if cfg.per_worker else None
        self.exploration = NoiseExploration(cfg.exploration_config, self.model.action_dim,
                                            self._rng, fixed)
        """The noise added to the actions when exploring."""
        self.global_step = 0
        """Updates applied (the actor steps when ``global_step % policy_delay == 0``)."""

    # ---- model and acting ----------------------------------------------------------------
    def make_model(self) -> nn.Module:
        """The :class:`DDPGModel`."""
        return DDPGModel(self.observation_space, self.action_space, self.config)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """One Adam (epsilon 1e-7) with an actor group (``actor_lr``) and a critic group
        (``critic_lr``: the Q network and its twin)."""
        assert isinstance(model, DDPGModel)
        critic = [p for net in model.q_networks() for p in net.parameters()]
        return torch.optim.Adam(
            [{"params": list(model.policy.parameters()), "name": ACTOR,
              "lr": self.config.actor_lr},
             {"params": critic, "name": CRITIC, "lr": self.config.critic_lr}],
            eps=ADAM_EPSILON, fused=True)

    def _set_optimizer_lr(self) -> None:
        """Each group learns at its rate (also after a restored optimizer state)."""
        if self._optimizer is None:
            return
        rates = {ACTOR: self.config.actor_lr, CRITIC: self.config.critic_lr}
        for group in self._optimizer.param_groups:
            group["lr"] = rates[group["name"]]

    def compute_actions(self, obs: np.ndarray, explore: bool = True, **_: Any
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The actor's actions in [-1, 1], with the exploration noise when ``explore``
        (at env step ``global_timestep``, which exploring advances by the number of
        observations)."""
        obs_t = torch.as_tensor(np.asarray(obs), device=self.device)
        with torch.inference_mode():
            actions = self.model(obs_t).float().cpu().numpy()
        if explore:
            actions = self.exploration(actions, self.global_timestep)
            self.global_timestep += len(actions)
        shape = (len(actions), *self.action_space.shape)
        return actions.reshape(shape).astype(self.action_space.dtype), {}

    # ---- postprocessing ------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """n-step returns (:func:`~actorrl.policy.dqn.adjust_nstep`) and a ``weights``
        column: ones, or with ``worker_side_prioritization`` the initial priorities
        ``|td_error| + prioritized_replay_eps``. With ``no_done_at_end`` no row is
        terminal."""
        cfg = self.config
        out = adjust_nstep(batch, cfg.n_step, cfg.gamma)
        if cfg.no_done_at_end:
            out[SampleBatch.TERMINATEDS] = np.zeros_like(out[SampleBatch.TERMINATEDS])
        if cfg.worker_side_prioritization and out.count > 0:
            out[SampleBatch.WEIGHTS] = (np.abs(self.compute_td_error(out))
                                        + cfg.prioritized_replay_eps).astype(np.float32)
        else:
            out[SampleBatch.WEIGHTS] = np.ones(out.count, dtype=np.float32)
        return out

    # ---- loss ----------------------------------------------------------------------------
    def smoothing_noise(self, target_actions: torch.Tensor, obs: torch.Tensor
                        ) -> torch.Tensor:
        """Standard-normal noise shaped as ``target_actions`` (``obs``: the next
        observations they are for); scaled by ``target_noise`` and clipped in the loss.
        Tests replace it to compare two computations of one update."""
        return torch.randn_like(target_actions)

    def _target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``r + gamma ** n_steps * (1 - terminated) * min_i Q_target_i(s', a')`` per row,
        with the (smoothed) target policy's ``a'``; no gradient."""
        cfg = self.config
        new_obs = batch[SampleBatch.NEXT_OBS]
        with torch.no_grad():
            (policy_tp1,) = on_target([self.target_model.policy], new_obs)
            if cfg.smooth_target_policy:
                noise = (self.smoothing_noise(policy_tp1, new_obs) * cfg.target_noise).clamp(
                    -cfg.target_noise_clip, cfg.target_noise_clip)
                policy_tp1 = (policy_tp1 + noise).clamp(-1.0, 1.0)
            q_tp1 = min_q(on_target(self.target_model.q_networks(), new_obs, policy_tp1))
            rewards = batch[SampleBatch.REWARDS].float()
            steps = batch[N_STEPS].to(q_tp1.dtype) if N_STEPS in batch else \
                torch.full_like(q_tp1, float(cfg.n_step))
            not_done = 1.0 - batch[SampleBatch.TERMINATEDS].float()
            return rewards + torch.pow(torch.full_like(q_tp1, cfg.gamma), steps) * \
                not_done * q_tp1

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The actor and critic losses summed (see the module docstring)."""
        assert isinstance(model, DDPGModel)
        cfg = self.config
        obs = batch[SampleBatch.OBS]
        actions = batch[SampleBatch.ACTIONS].float().reshape(obs.shape[0], -1)
        target = self._target(batch)
        q_selected = [net(obs, actions) for net in model.q_networks()]
        errors = [q - target for q in q_selected]
        per_row = sum((huber_loss(e, cfg.huber_threshold) if cfg.use_huber
                       else 0.5 * e.pow(2)) for e in errors)
        assert isinstance(per_row, torch.Tensor)
        weights = batch.get(SampleBatch.WEIGHTS)
        critic_loss = (per_row if weights is None else weights.float() * per_row).mean()
        actor_loss = -detached_call(model.q, obs, model(obs)).mean()
        if cfg.l2_reg:
            actor_loss = actor_loss + cfg.l2_reg * l2_weights(model.policy)
            critic_loss = critic_loss + cfg.l2_reg * torch.stack(
                [l2_weights(net) for net in model.q_networks()]).sum()
        td_error = errors[0].detach()
        q_t = q_selected[0].detach()
        stats = {"actor_loss": actor_loss.detach(), "critic_loss": critic_loss.detach(),
                 "mean_q": q_t.mean(), "max_q": q_t.max(), "min_q": q_t.min(),
                 "mean_td_error": td_error.mean()}
        return LossOutput(loss=actor_loss + critic_loss, stats=stats,
                          per_sample={"td_error": td_error})

    def compute_td_error(self, batch: SampleBatch) -> np.ndarray:
        """Per-row TD errors of ``batch`` with the current networks, without a step."""
        with torch.no_grad():
            out = self.loss(self.model, self.batch_to_tensors(batch))
        return out.per_sample["td_error"].cpu().numpy()

    # ---- the update ----------------------------------------------------------------------
    def actor_steps_now(self) -> bool:
        """Whether the next update steps the actor (``global_step % policy_delay == 0``)."""
        return self.global_step % self.config.policy_delay == 0

    def _clip_and_step(self) -> None:
        """Drop the actor's gradients on a delayed update, clip each group's gradient norm
        on its own (``grad_clip``), step, count the update (targets may follow)."""
        actor_steps = self.actor_steps_now()
        clip = self.config.grad_clip
        for group in self.optimizer.param_groups:
            if group["name"] == ACTOR and not actor_steps:
                for p in group["params"]:
                    p.grad = None
            params = [p for p in group["params"] if p.grad is not None]
            if clip and params:
                torch.nn.utils.clip_grad_norm_(params, float(clip))
        self.optimizer.step()
        self.global_step += 1
        self.num_updates = getattr(self, "num_updates", 0) + 1
        self.after_update(self.num_updates)

    def soft_target_parameters(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every parameter (actor and Q networks), online and target."""
        return list(self.model.parameters()), list(self.target_model.parameters())

    def acting_weight_names(self) -> frozenset[str] | None:
        """The actor's weights; all of them with ``worker_side_prioritization`` (a worker
        then computes its rows' TD errors with the Q networks too)."""
        if self.config.worker_side_prioritization:
            return None
        return super().acting_weight_names()

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load online weights; on a rollout worker (``worker_index >= 1``) the targets
        follow them (its worker-side TD errors then use the current networks)."""
        super().set_weights(weights)
        if self.config.worker_index >= 1:
            self.target_model.load_state_dict(self.model.state_dict())

    def get_state(self) -> dict[str, Any]:
        """The soft-target state plus the update count and the OU process's state."""
        state = super().get_state()
        state["global_step"] = self.global_step
        state["ou_state"] = self.exploration.ou_state.copy()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned."""
        super().set_state(state)
        self.global_step = int(state.get("global_step", 0))
        if "ou_state" in state:
            self.exploration.ou_state = np.array(state["ou_state"], dtype=np.float64)


class TD3Policy(DDPGPolicy):
    """:class:`DDPGPolicy` reading :class:`~actorrl.policy.ddpg_config.TD3PolicyConfig`
    (TD3's defaults, e.g. for a checkpoint's mapping)."""

    config_class = TD3PolicyConfig
    config: TD3PolicyConfig


class ApexDDPGPolicy(DDPGPolicy):
    """:class:`DDPGPolicy` reading
    :class:`~actorrl.policy.ddpg_config.ApexDDPGPolicyConfig` (Ape-X DDPG's defaults)."""

    config_class = ApexDDPGPolicyConfig
    config: ApexDDPGPolicyConfig


__all__ = ["ApexDDPGPolicy", "DDPGModel", "DDPGPolicy", "TD3Policy", "l2_weights"]
