"""Soft Actor-Critic (RLlib's SAC): twin Q networks with soft-updated targets, a learned
entropy temperature, and a tanh-squashed Gaussian policy (``Box`` actions) or a
categorical one (``Discrete`` actions, RLlib's discrete SAC).

Read top to bottom: the squashed Gaussian, the networks, the policy (acting, the loss, the
optimizer and the target networks).

Actions
    On a ``Box`` space the policy acts in [-1, 1] (``tanh`` of a Gaussian sample); the
    rollout worker maps those actions onto the space's bounds before ``env.step``
    (``normalize_actions``, RLlib's default) and the batch keeps the policy's own action,
    which the Q networks read.

One module, one optimizer, four parameter groups
    The actor, the Q network, the twin Q network and ``log_alpha`` live in one
    :class:`SACModel`, so the learner's towers replicate and average it like any model.
    The loss is the sum of RLlib's four losses (actor, critic, twin critic, alpha), each
    reaching only its own parameters: the actor's Q-values are computed with detached Q
    parameters (:func:`torch.func.functional_call`), alpha is detached in the actor loss
    and the log-probabilities in the alpha loss, and the critic targets come from the
    target networks without a gradient. One backward pass then gives each parameter the
    gradient of its own loss, and one Adam with a parameter group per loss (RLlib's four
    Adams: learning rates from ``optimization``, epsilon 1e-7) steps each group as its own
    optimizer would; ``grad_clip`` clips each group's norm on its own, as RLlib clips per
    optimizer.

Target networks
    ``target_model`` is a copy of the model whose Q networks follow the online ones:
    ``target <- tau * online + (1 - tau) * target`` (:meth:`SACPolicy.update_target`) once
    ``target_network_update_freq`` rows were trained since the last update (the algorithm
    hands RLlib's env-step period over in trained rows; 0 or 1: after every update), and a
    full copy at the start, as RLlib's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from actorrl.data.batch import SampleBatch
from actorrl.policy.base import LossOutput
from actorrl.policy.continuous_q import (
    ADAM_EPSILON,
    QNetwork,
    SoftTargetPolicy,
    detached_call,
    min_q,
    observation_encoder,
    on_target,
)
from actorrl.policy.dqn import N_STEPS, adjust_nstep, huber_loss
from actorrl.policy.encoders import build_mlp
from actorrl.policy.sac_config import SACPolicyConfig

LOG_STD_MIN = -5.0
"""Lower clamp of the policy's log-std output (RLlib's ``MIN_LOG_NN_OUTPUT``)."""
LOG_STD_MAX = 2.0
"""Upper clamp of the policy's log-std output (RLlib's ``MAX_LOG_NN_OUTPUT``)."""
ACTOR, CRITIC, TWIN_CRITIC, ALPHA = "actor", "critic", "twin_critic", "alpha"
"""The optimizer's parameter groups, by ``name``."""


# ---- the squashed Gaussian ---------------------------------------------------------------
class SquashedGaussian:
    """``tanh(u)``, ``u ~ N(mean, exp(log_std))``: actions in (-1, 1). ``inputs`` holds the
    means then the log-stds (``[B, 2 * action_dim]``); the log-stds are clamped to
    [:data:`LOG_STD_MIN`, :data:`LOG_STD_MAX`] as RLlib's ``TorchSquashedGaussian``."""

    def __init__(self, inputs: torch.Tensor) -> None:
        mean, log_std = torch.chunk(inputs, 2, dim=-1)
        self.mean = mean
        self.log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        self.std = self.log_std.exp()

    def rsample(self, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log_prob)`` of the reparameterized sample ``u = mean + std * noise``
        (``noise`` standard normal, the shape of ``mean``): gradients flow through both."""
        unsquashed = self.mean + self.std * noise
        return torch.tanh(unsquashed), self.log_prob_unsquashed(unsquashed)

    def log_prob_unsquashed(self, unsquashed: torch.Tensor) -> torch.Tensor:
        """``log p(tanh(u))`` summed over the action dims: the Gaussian's log-density of
        ``u`` minus ``log(1 - tanh(u)^2)`` (the tanh's Jacobian), the latter written as
        ``2 (log 2 - u - softplus(-2u))``, exact where ``tanh`` saturates."""
        z = (unsquashed - self.mean) / self.std
        gaussian = -0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2.0 * math.pi)
        jacobian = 2.0 * (math.log(2.0) - unsquashed - F.softplus(-2.0 * unsquashed))
        return (gaussian - jacobian).sum(dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log p(actions)`` of squashed actions (clipped just inside (-1, 1), then
        unsquashed with ``atanh``), summed over the action dims."""
        bound = 1.0 - 1e-6
        return self.log_prob_unsquashed(torch.atanh(actions.clamp(-bound, bound)))

    def deterministic(self) -> torch.Tensor:
        """``tanh(mean)``: the action when not exploring."""
        return torch.tanh(self.mean)


# ---- the networks (Q networks: actorrl.policy.continuous_q) -------------------------------
def build_fcnet_mlp(in_dim: int, hiddens: list[int], activation: str | None, out_dim: int
                    ) -> nn.Sequential:
    """Linear + activation per hidden layer, then a linear output: RLlib's fully connected
    network, which its SAC builds the policy and each Q network with (normalized-column
    weights of norm 1, the output layer's of norm 0.01, zero biases)."""
    return build_mlp(in_dim, hiddens, activation or "linear", out_dim, out_init_std=0.01)


class SACModel(nn.Module):
    """The actor (``policy``: distribution inputs), the Q network(s) and ``log_alpha``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space,
                 config: SACPolicyConfig) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        num_actions = int(action_space.n) if self.discrete else None
        self.action_dim = 1 if self.discrete else int(np.prod(action_space.shape))
        encoder, features = observation_encoder(obs_space, config.model)
        policy_net = config.policy_net
        outputs = num_actions if num_actions is not None else 2 * self.action_dim
        self.policy = nn.Sequential(encoder, build_fcnet_mlp(
            features, list(policy_net["fcnet_hiddens"]), policy_net["fcnet_activation"],
            outputs))
        q_net = config.q_net
        self.q = QNetwork(obs_space, config.model, q_net, self.action_dim, num_actions,
                          build_fcnet_mlp)
        self.twin_q = (QNetwork(obs_space, config.model, q_net, self.action_dim, num_actions,
                                build_fcnet_mlp) if config.twin_q else None)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.initial_alpha)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's distribution inputs (means and log-stds, or logits)."""
        return self.policy(obs)

    def q_networks(self) -> list[nn.Module]:
        """The Q network and, with ``twin_q``, the twin."""
        return [self.q] if self.twin_q is None else [self.q, self.twin_q]


def auto_target_entropy(action_space: gym.Space) -> float:
    """RLlib's ``target_entropy: auto``: ``0.98 * log(n)`` for ``Discrete(n)`` (98% of the
    uniform policy's entropy), ``-action_dim`` for ``Box``."""
    if isinstance(action_space, gym.spaces.Discrete):
        return 0.98 * math.log(int(action_space.n))
    return -float(np.prod(action_space.shape))


# ---- the policy --------------------------------------------------------------------------
class SACPolicy(SoftTargetPolicy):
    """SAC for ``Box`` (squashed Gaussian) and ``Discrete`` (categorical) action spaces;
    see the module docstring and :class:`SACPolicyConfig`."""

    config_class = SACPolicyConfig
    config: SACPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: SACPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        box = isinstance(action_space, gym.spaces.Box) and \
            np.issubdtype(action_space.dtype, np.floating)
        if not box and not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"action space {action_space} is not supported by SAC: it needs "
                             "a float Box (continuous) or a Discrete action space")
        super().__init__(observation_space, action_space, config, device)
        if box and not self.config.normalize_actions:
            raise ValueError(
                "normalize_actions: false cannot be honoured by SAC on a Box action space: "
                "its tanh-squashed Gaussian acts in [-1, 1], which the sampler maps onto the "
                "space's bounds (RLlib then switches to an unsquashed Gaussian, which "
                "actorrl's SAC does not build); set normalize_actions: true")
        entropy = self.config.target_entropy
        self.target_entropy = (auto_target_entropy(action_space)
                               if entropy in (None, "auto") else float(entropy))
        """The entropy the temperature steers toward (``target_entropy`` resolved)."""
        self.init_targets()
        seed = self.config.seed
        self._rng = np.random.default_rng(
            None if seed is None else [seed, self.config.worker_index])

    # ---- model and acting ----------------------------------------------------------------
    def make_model(self) -> nn.Module:
        """The :class:`SACModel`."""
        return SACModel(self.observation_space, self.action_space, self.config)

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """One Adam (epsilon 1e-7) with a parameter group per loss: actor, critic, twin
        critic, alpha; their learning rates from ``optimization`` (or ``actor_lr``,
        ``critic_lr``, ``alpha_lr``)."""
        assert isinstance(model, SACModel)
        actor_lr, critic_lr, alpha_lr = self.config.learning_rates
        groups = [{"params": list(model.policy.parameters()), "name": ACTOR, "lr": actor_lr},
                  {"params": list(model.q.parameters()), "name": CRITIC, "lr": critic_lr}]
        if model.twin_q is not None:
            groups.append({"params": list(model.twin_q.parameters()), "name": TWIN_CRITIC,
                           "lr": critic_lr})
        groups.append({"params": [model.log_alpha], "name": ALPHA, "lr": alpha_lr})
        return torch.optim.Adam(groups, eps=ADAM_EPSILON, fused=True)

    def _set_optimizer_lr(self) -> None:
        """Each group learns at its ``optimization`` rate (also after a restored optimizer
        state, which carries the rates of the run that saved it)."""
        if self._optimizer is None:
            return
        actor_lr, critic_lr, alpha_lr = self.config.learning_rates
        rates = {ACTOR: actor_lr, CRITIC: critic_lr, TWIN_CRITIC: critic_lr, ALPHA: alpha_lr}
        for group in self._optimizer.param_groups:
            group["lr"] = rates[group["name"]]

    def _random_actions(self, count: int) -> np.ndarray:
        """``count`` uniformly random actions (``Box``: in [-1, 1]); advances
        ``global_timestep``."""
        self.global_timestep += count
        if self.model.discrete:
            return self._rng.integers(0, int(self.action_space.n), count).astype(np.int64)
        shape = (count, *self.action_space.shape)
        return self._rng.uniform(-1.0, 1.0, shape).astype(self.action_space.dtype)

    def compute_actions(self, obs: np.ndarray, explore: bool = True, **_: Any
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sampled actions (``explore``; uniformly random ones for the first
        ``random_timesteps``) or the deterministic ones (``tanh(mean)``, the most likely
        action of a ``Discrete`` space): ``Box`` actions in [-1, 1]. Exploring advances
        ``global_timestep`` by the number of observations."""
        if explore and self.global_timestep < self.config.random_timesteps:
            return self._random_actions(len(obs)), {}
        obs_t = torch.as_tensor(np.asarray(obs), device=self.device)
        with torch.inference_mode():
            inputs = self.model(obs_t).float().cpu()
        if self.model.discrete:
            logits = inputs.numpy()
            if explore:
                probs = np.exp(logits - logits.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                draws = self._rng.random((len(probs), 1))
                actions = np.minimum((probs.cumsum(axis=1) < draws).sum(axis=1),
                                     probs.shape[1] - 1)
            else:
                actions = logits.argmax(axis=1)
            out = actions.astype(np.int64)
        else:
            dist = SquashedGaussian(inputs)
            if explore:
                noise = torch.from_numpy(
                    self._rng.standard_normal(tuple(dist.mean.shape)).astype(np.float32))
                actions_t, _ = dist.rsample(noise)
            else:
                actions_t = dist.deterministic()
            shape = (len(actions_t), *self.action_space.shape)
            out = actions_t.numpy().reshape(shape).astype(self.action_space.dtype)
        if explore:
            self.global_timestep += len(out)
        return out, {}

    # ---- postprocessing ------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """n-step returns (:func:`~actorrl.policy.dqn.adjust_nstep`, which writes the
        ``n_steps`` column) and a ``weights`` column of ones (replay's importance weights
        replace it). With ``no_done_at_end`` no row is terminal (RLlib 1.x)."""
        out = adjust_nstep(batch, self.config.n_step, self.config.gamma)
        if self.config.no_done_at_end:
            out[SampleBatch.TERMINATEDS] = np.zeros_like(out[SampleBatch.TERMINATEDS])
        out[SampleBatch.WEIGHTS] = np.ones(out.count, dtype=np.float32)
        return out

    # ---- loss ----------------------------------------------------------------------------
    def loss_noise(self, mean: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The standard-normal noise of the loss's reparameterized samples (one row per row
        of ``mean``; ``obs`` are the observations the samples are for). Tests replace it
        with a fixed function to compare two computations of one update."""
        return torch.randn_like(mean)

    def _discount(self, batch: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """``gamma ** k`` per row, ``k`` the row's ``n_steps`` (else ``n_step``)."""
        gamma = self.config.gamma
        if N_STEPS in batch:
            return torch.pow(torch.full_like(like, gamma), batch[N_STEPS].to(like.dtype))
        return torch.full_like(like, gamma ** self.config.n_step)

    def _target_q(self, q_tp1: list[torch.Tensor]) -> torch.Tensor:
        """The minimum over the target Q networks' values (one without ``twin_q``)."""
        return min_q(q_tp1)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """RLlib's SAC losses summed (see the module docstring): per row ``td_error`` is
        the mean of the Q networks' absolute TD errors."""
        assert isinstance(model, SACModel)
        obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
        inputs_t = model(obs)
        with torch.no_grad():  # one batched forward of both would double the backward's work
            inputs_tp1 = model(new_obs)
        alpha = model.log_alpha.exp()
        rewards = batch[SampleBatch.REWARDS].float()
        not_done = 1.0 - batch[SampleBatch.TERMINATEDS].float()
        target_model = self.target_model
        if model.discrete:
            parts = self._discrete_terms(model, target_model, batch, inputs_t, inputs_tp1,
                                         alpha)
        else:
            parts = self._continuous_terms(model, target_model, batch, inputs_t, inputs_tp1,
                                           alpha)
        q_selected, q_tp1_best, actor_loss, alpha_loss, q_t = parts
        with torch.no_grad():
            target = rewards + self._discount(batch, rewards) * not_done * q_tp1_best
        errors = [q - target for q in q_selected]
        weights = batch.get(SampleBatch.WEIGHTS)
        critic_losses = [(huber_loss(e) if weights is None
                          else weights.float() * huber_loss(e)).mean() for e in errors]
        td_error = torch.stack([e.detach().abs() for e in errors]).mean(dim=0)
        total = actor_loss + alpha_loss + sum(critic_losses)
        stats = {
            "actor_loss": actor_loss.detach(),
            "critic_loss": torch.stack(critic_losses).detach().mean(),
            "alpha_loss": alpha_loss.detach(),
            "alpha_value": alpha.detach(),
            "log_alpha_value": model.log_alpha.detach(),
            "target_entropy": self.target_entropy,
            "mean_q": q_t.detach().mean(),
            "max_q": q_t.detach().max(),
            "min_q": q_t.detach().min(),
            "mean_td_error": td_error.mean(),
        }
        return LossOutput(loss=total, stats=stats, per_sample={"td_error": td_error})

    def _continuous_terms(self, model: SACModel, target_model: SACModel,
                          batch: dict[str, torch.Tensor], inputs_t: torch.Tensor,
                          inputs_tp1: torch.Tensor, alpha: torch.Tensor
                          ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor,
                                     torch.Tensor, torch.Tensor]:
        """``(Q(s, a) per network, soft target value of s', actor loss, alpha loss, Q(s,
        a))`` for ``Box`` actions."""
        obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
        actions = batch[SampleBatch.ACTIONS].float().reshape(obs.shape[0], -1)
        dist_t = SquashedGaussian(inputs_t)
        pi_t, logp_t = dist_t.rsample(self.loss_noise(dist_t.mean, obs))
        with torch.no_grad():
            dist_tp1 = SquashedGaussian(inputs_tp1)
            pi_tp1, logp_tp1 = dist_tp1.rsample(self.loss_noise(dist_tp1.mean, new_obs))
            q_tp1 = self._target_q(on_target(target_model.q_networks(), new_obs, pi_tp1))
            q_tp1_best = q_tp1 - alpha * logp_tp1
        q_selected = [net(obs, actions) for net in model.q_networks()]
        q_pi = self._target_q([detached_call(net, obs, pi_t) for net in model.q_networks()])
        actor_loss = (alpha.detach() * logp_t - q_pi).mean()
        alpha_loss = -(model.log_alpha * (logp_t + self.target_entropy).detach()).mean()
        return q_selected, q_tp1_best, actor_loss, alpha_loss, q_selected[0]

    def _discrete_terms(self, model: SACModel, target_model: SACModel,
                        batch: dict[str, torch.Tensor], inputs_t: torch.Tensor,
                        inputs_tp1: torch.Tensor, alpha: torch.Tensor
                        ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor,
                                   torch.Tensor, torch.Tensor]:
        """As :meth:`_continuous_terms` for ``Discrete`` actions: expectations over the
        policy's probabilities instead of samples (RLlib's discrete SAC; its actor loss
        reads the first Q network)."""
        obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
        log_pis_t = F.log_softmax(inputs_t, dim=-1)
        policy_t = log_pis_t.exp()
        q_t_all = [net(obs) for net in model.q_networks()]
        with torch.no_grad():
            log_pis_tp1 = F.log_softmax(inputs_tp1, dim=-1)
            q_tp1 = self._target_q(on_target(target_model.q_networks(), new_obs))
            q_tp1_best = (log_pis_tp1.exp() * (q_tp1 - alpha * log_pis_tp1)).sum(dim=-1)
        actions = batch[SampleBatch.ACTIONS].long().reshape(-1, 1)
        q_selected = [q.gather(1, actions).squeeze(1) for q in q_t_all]
        actor_loss = (policy_t * (alpha.detach() * log_pis_t - q_t_all[0].detach())
                      ).sum(dim=-1).mean()
        alpha_loss = (policy_t.detach() * (
            -model.log_alpha * (log_pis_t + self.target_entropy).detach())).sum(dim=-1).mean()
        return q_selected, q_tp1_best, actor_loss, alpha_loss, q_t_all[0]

    def compute_td_error(self, batch: SampleBatch) -> np.ndarray:
        """Per-row TD errors of ``batch`` with the current networks, without a step."""
        with torch.no_grad():
            out = self.loss(self.model, self.batch_to_tensors(batch))
        return out.per_sample["td_error"].cpu().numpy()

    # ---- training and the target networks ------------------------------------------------
    def _clip_and_step(self) -> None:
        """Clip each parameter group's gradient norm on its own (``grad_clip``; RLlib clips
        per optimizer), step, then count the update."""
        clip = self.config.grad_clip
        if clip:
            for group in self.optimizer.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if params:
                    torch.nn.utils.clip_grad_norm_(params, float(clip))
        self.optimizer.step()
        self.num_updates = getattr(self, "num_updates", 0) + 1
        self.after_update(self.num_updates)

    def soft_target_parameters(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The Q networks' parameters (online, target): only they have targets."""
        online = [p for net in self.model.q_networks() for p in net.parameters()]
        target = [p for net in self.target_model.q_networks() for p in net.parameters()]
        return online, target


__all__ = ["SACModel", "SACPolicy", "SquashedGaussian", "auto_target_entropy"]
