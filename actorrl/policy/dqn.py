"""Ape-X DQN policy: double Q, dueling heads, n-step returns, a target network, Huber loss
with importance weights, and epsilon-greedy exploration (linear schedule or Ape-X's fixed
per-worker epsilons).

Read top to bottom: the config, the Q network, n-step postprocessing, then the policy.

Target network: the policy owns ``target_model`` and syncs it itself. Every applied update
counts the rows it trained on (``num_steps_trained``); when ``num_steps_trained`` minus its
value at the last sync reaches ``target_network_update_freq``, ``update_target()`` copies
the online weights (RLlib's Ape-X rule, counted in trained rows). The rows of an update are
the batch's ``count`` for :meth:`DQNPolicy.learn_on_batch` and for
``compute_gradients`` + ``apply_gradients`` on this same policy; gradients computed
elsewhere count ``train_batch_size`` rows per applied update. ``update_target()`` may also
be called directly.

Recurrent Q-network (``model: {use_lstm: true}``, or a recurrent custom model)
    :class:`~actorrl.policy.recurrent_q.RecurrentQNetwork` replaces :class:`QNetwork`. The
    policy then acts like the actor-critic ones (``compute_actions`` takes each env's state,
    and the previous actions and rewards where configured, and returns ``state_out_*``):
    epsilon-greedy over the Q-values of the step. Samplers cut fragments into sequences of
    at most ``max_seq_len`` rows, each with its start state. Ape-X trains it from batch
    replay only (``batch_replay: true``), which keeps those sequences whole.

    n-step returns stop at sequence boundaries: postprocessing ends a row's n-step window
    at the last row of its sequence (as if the fragment were cut there), so every row's
    ``new_obs`` is an observation the sequence's unroll reaches. The loss unrolls the online
    and the target network over each sequence from its stored start state, over its rows
    and one more step on the last row's ``new_obs`` (:func:`~actorrl.policy.recurrent_q.
    unroll_q`); row ``t`` of a sequence takes ``Q(s_t, a_t)`` at position ``t`` and its
    next-state Q-values at position ``t + n_steps``. Padding is never part of the loss.
    Double Q picks the next action with the online unroll, the target unroll evaluates it.

Rollout workers (``worker_index >= 1``) never train, so their target network follows the
weights they receive: ``set_weights`` syncs it. That keeps the worker-side initial
priorities (``worker_side_prioritization``) computed with the current network.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from actorrl.data.batch import SampleBatch, chop_into_sequences
from actorrl.policy.action_masking import legal_values, mask_layout, masked_model
from actorrl.policy.base import LossOutput
from actorrl.policy.config import DQNPolicyConfig, ExplorationConfig
from actorrl.policy.encoders import ConvEncoder, build_encoder, build_mlp, xavier_uniform_init_
from actorrl.policy.models import make_model, resolve_model_config
from actorrl.policy.recurrent_q import RecurrentQNetwork, unroll_q
from actorrl.policy.target_networks import TargetNetworkPolicy

N_STEPS = "n_steps"
"""Column written by n-step postprocessing: the number of env steps ``k`` between ``obs``
and ``new_obs``, so the target is ``rewards + gamma**k * (1 - terminateds) * Q'(new_obs)``."""

# ---- config ------------------------------------------------------------------------------
# DQNPolicyConfig and ExplorationConfig live in actorrl.policy.config (torch-free).


def apex_worker_epsilon(worker_index: int, num_workers: int) -> float:
    """Ape-X's fixed epsilon of rollout worker ``worker_index`` (1..N) of ``num_workers``:
    ``0.4 ** (1 + 7 (i - 1) / (N - 1))``, and 0.4 for a single worker."""
    if worker_index < 1:
        raise ValueError(f"worker_index must be >= 1 for a worker epsilon, got {worker_index}")
    if num_workers <= 1:
        return 0.4
    return 0.4 ** (1.0 + 7.0 * (worker_index - 1) / (num_workers - 1))


def linear_epsilon(timestep: int, cfg: ExplorationConfig) -> float:
    """The linear epsilon schedule at ``timestep`` (constant after ``epsilon_timesteps``)."""
    frac = min(max(timestep, 0) / cfg.epsilon_timesteps, 1.0)
    return cfg.initial_epsilon + frac * (cfg.final_epsilon - cfg.initial_epsilon)


# ---- the Q network -----------------------------------------------------------------------
class QNetwork(nn.Module):
    """Q(s, .) for a discrete action space: a trunk from :func:`build_encoder`, then an
    advantage head and, when dueling, a value head, aggregated as ``V + A - mean(A)``.
    Each head has the ``hiddens`` layers (relu) before its output layer."""

    def __init__(self, trunk: nn.Module, trunk_dim: int, num_actions: int,
                 hiddens: tuple[int, ...], dueling: bool) -> None:
        super().__init__()
        self.trunk = trunk
        self.advantage = build_mlp(trunk_dim, hiddens, "relu", num_actions)
        self.value = build_mlp(trunk_dim, hiddens, "relu", 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, num_actions]`` Q-values."""
        features = self.trunk(obs)
        advantages = self.advantage(features)
        if self.value is None:
            return advantages
        return self.value(features) + advantages - advantages.mean(dim=1, keepdim=True)


class CustomQNetwork(nn.Module):
    """Adapts a catalog model (``forward(obs) -> (outputs, value)``) whose ``outputs`` are
    the Q-values."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, num_actions]`` Q-values: the wrapped model's outputs."""
        return self.model(obs)[0]


def build_q_network(obs_space: gym.Space, num_actions: int, cfg: DQNPolicyConfig
                    ) -> nn.Module:
    """The Q network for ``cfg``: ``model.custom_model`` when set (its outputs are the
    Q-values; ``dueling`` and ``hiddens`` do not apply; under ``use_lstm`` it is used as it
    is, recurrent), else :class:`RecurrentQNetwork` under ``use_lstm``, else
    :class:`QNetwork` over :func:`build_encoder` (``fcnet_activation`` defaults to relu for
    DQN; with ``vision_net: rllib`` over an image, its heads start xavier-uniform as
    RLlib's)."""
    model_config = resolve_model_config({"fcnet_activation": "relu", **cfg.model})
    if model_config["custom_model"] is not None:
        model = make_model(obs_space, gym.spaces.Discrete(num_actions), num_actions,
                           model_config)
        return model if model_config["use_lstm"] else CustomQNetwork(model)
    if model_config["use_lstm"]:
        return RecurrentQNetwork(obs_space, num_actions, model_config, cfg.hiddens,
                                 cfg.dueling)
    trunk, trunk_dim = build_encoder(obs_space, model_config)
    network = QNetwork(trunk, trunk_dim, num_actions, cfg.hiddens, cfg.dueling)
    if model_config["vision_net"] == "rllib" and isinstance(trunk, ConvEncoder):
        # RLlib's DQN heads (SlimFC) start xavier-uniform; over RLlib's large unscaled
        # features that is the Q network RLlib trains (benchmarks/dqn_input_scale.py).
        for head in (network.advantage, network.value):
            for layer in head.modules() if head is not None else ():
                if isinstance(layer, nn.Linear):
                    xavier_uniform_init_(layer)
    return network


# ---- n-step returns ----------------------------------------------------------------------
def adjust_nstep(batch: SampleBatch, n_step: int, gamma: float,
                 cut_every: int | None = None) -> SampleBatch:
    """n-step transitions from consecutive ones, as a new batch.

    Row ``i`` becomes ``r_i + gamma r_{i+1} + ... + gamma^{k-1} r_{i+k-1}`` with ``new_obs``,
    ``terminateds`` and ``truncateds`` of row ``i+k-1``, and ``n_steps = k``, where ``k`` is
    ``n_step`` or fewer when the trajectory ends first: at a terminated or truncated row,
    where ``eps_id`` changes, at the end of the batch (a fragment cut), or, with
    ``cut_every``, at every ``cut_every``-th row (the last rows of the sequences a
    recurrent policy's fragment is cut into). Only a terminated row stops the bootstrap;
    truncation and cuts bootstrap from ``new_obs``.
    """
    count = batch.count
    out = SampleBatch(dict(batch))
    if count == 0:
        out[N_STEPS] = np.zeros(0, dtype=np.int32)
        return out
    terminated = np.asarray(batch[SampleBatch.TERMINATEDS]).astype(bool)
    truncated = (np.asarray(batch[SampleBatch.TRUNCATEDS]).astype(bool)
                 if SampleBatch.TRUNCATEDS in batch else np.zeros(count, dtype=bool))
    ends = terminated | truncated
    ends[-1] = True
    if cut_every is not None:
        ends[cut_every - 1::cut_every] = True
    if SampleBatch.EPS_ID in batch:
        eps = np.asarray(batch[SampleBatch.EPS_ID])
        ends[:-1] |= eps[1:] != eps[:-1]
    end_rows = np.flatnonzero(ends)
    rows = np.arange(count)
    segment_end = end_rows[np.searchsorted(end_rows, rows)]
    last = np.minimum(rows + n_step - 1, segment_end)
    steps = last - rows + 1

    rewards = np.asarray(batch[SampleBatch.REWARDS], dtype=np.float64)
    total = np.zeros(count, dtype=np.float64)
    for j in range(n_step):
        inside = j < steps
        total += np.where(inside, gamma**j * rewards[np.minimum(rows + j, count - 1)], 0.0)

    reward_dtype = batch[SampleBatch.REWARDS].dtype
    out[SampleBatch.REWARDS] = total.astype(reward_dtype if reward_dtype.kind == "f"
                                            else np.float32)
    out[SampleBatch.NEXT_OBS] = np.asarray(batch[SampleBatch.NEXT_OBS])[last]
    out[SampleBatch.TERMINATEDS] = np.asarray(batch[SampleBatch.TERMINATEDS])[last]
    if SampleBatch.TRUNCATEDS in batch:
        out[SampleBatch.TRUNCATEDS] = np.asarray(batch[SampleBatch.TRUNCATEDS])[last]
    out[N_STEPS] = steps.astype(np.int32)
    return out


def huber_loss(x: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Elementwise Huber loss: ``0.5 x^2`` for ``|x| < delta``, else
    ``delta (|x| - 0.5 delta)``."""
    abs_x = x.abs()
    return torch.where(abs_x < delta, 0.5 * x.pow(2), delta * (abs_x - 0.5 * delta))


# ---- the policy --------------------------------------------------------------------------
class DQNPolicy(TargetNetworkPolicy):
    """DQN / Ape-X DQN policy for discrete action spaces. See the module docstring for the
    target network and :class:`DQNPolicyConfig` for the settings."""

    config_class = DQNPolicyConfig
    config: DQNPolicyConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: DQNPolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(
                f"action space {action_space} is not supported by DQN/Ape-X: Q-learning needs "
                f"a Discrete action space (one Q-value per action); for "
                f"{type(action_space).__name__} actions use IMPALA, A2C or A3C")
        super().__init__(observation_space, action_space, config, device)
        self.target_model = copy.deepcopy(self.model)
        self.target_model.requires_grad_(False)
        self.target_model.eval()
        self.num_steps_trained = 0
        self.last_target_update_steps = 0
        self.num_target_updates = 0
        self._pending_rows = 0
        seed = self.config.seed
        self._rng = np.random.default_rng(
            None if seed is None else [seed, self.config.worker_index])

    # ---- model and acting ----------------------------------------------------------------
    def make_model(self) -> nn.Module:
        """The Q network (see :class:`QNetwork`); for an ``action_mask`` observation, built
        on its ``observations`` and masked (:mod:`actorrl.policy.action_masking`: masked
        Q-values are never greedy actions nor target maxima)."""
        return masked_model(self.observation_space, self.action_space,
                            lambda space: build_q_network(space, int(self.action_space.n),
                                                          self.config))

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """Adam with ``lr`` and ``adam_epsilon``."""
        return torch.optim.Adam(model.parameters(), lr=self.config.lr,
                                eps=self.config.adam_epsilon, foreach=True)

    def current_epsilon(self) -> float:
        """The exploration epsilon now: Ape-X's fixed per-worker value (0 on the learner,
        worker 0) with per-worker exploration, else the linear schedule at
        ``global_timestep``."""
        cfg = self.config
        if cfg.per_worker:
            if cfg.worker_index == 0:
                return 0.0
            return apex_worker_epsilon(cfg.worker_index, cfg.num_workers)
        return linear_epsilon(self.global_timestep, cfg.exploration_config)

    def compute_actions(self, obs: np.ndarray, explore: bool = True, *,
                        state: list[np.ndarray] | None = None,
                        prev_actions: np.ndarray | None = None,
                        prev_rewards: np.ndarray | None = None
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy actions (greedy when ``explore`` is false). Exploring advances
        ``global_timestep`` by the number of observations, as RLlib does; the rollout
        worker may overwrite it with :meth:`on_global_timestep`. A recurrent policy takes
        each env's ``state`` (and previous actions / rewards where the model reads them)
        and returns the state after the step as ``state_out_*`` (see
        :mod:`actorrl.policy.base`)."""
        obs_t = torch.as_tensor(np.asarray(obs), device=self.device)
        extras: dict[str, np.ndarray] = {}
        with torch.inference_mode():  # cheaper per op than no_grad; nothing here trains
            if self.is_recurrent:
                q_values, _, extras = self.recurrent_step(obs_t, state, prev_actions,
                                                          prev_rewards)
            else:
                q_values = self.model(obs_t)
        actions = q_values.argmax(dim=1).cpu().numpy()
        if explore:
            epsilon = self.current_epsilon()
            if epsilon > 0.0:
                explore_rows = self._rng.random(len(actions)) < epsilon
                random_actions = self._random_actions(np.asarray(obs), len(actions))
                actions = np.where(explore_rows, random_actions, actions)
            self.global_timestep += len(actions)
        return actions.astype(np.int64), extras

    def _random_actions(self, obs: np.ndarray, count: int) -> np.ndarray:
        """Uniform random actions; with an action mask, uniform among each row's legal
        ones."""
        layout = mask_layout(self.model)
        if layout is None:
            return self._rng.integers(0, self.action_space.n, count)
        scores = self._rng.random((count, int(self.action_space.n)))
        return np.where(layout.legal(obs), scores, -1.0).argmax(axis=1)

    # ---- postprocessing ------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """n-step returns (:func:`adjust_nstep`, adds the ``n_steps`` column; a recurrent
        policy's stop at its sequences' ends, see the module docstring) and a ``weights``
        column: ones, or with ``worker_side_prioritization`` the initial replay
        priorities ``|td_error| + prioritized_replay_eps`` (RLlib's convention: the replay
        actor reads priorities of new rows from ``weights``)."""
        cfg = self.config
        out = adjust_nstep(batch, cfg.n_step, cfg.gamma,
                           cut_every=self.max_seq_len if self.is_recurrent else None)
        if cfg.worker_side_prioritization and out.count > 0:
            td_error = self.compute_td_error(out)
            out[SampleBatch.WEIGHTS] = (np.abs(td_error) + cfg.prioritized_replay_eps
                                        ).astype(np.float32)
        else:
            out[SampleBatch.WEIGHTS] = np.ones(out.count, dtype=np.float32)
        return out

    # ---- loss ----------------------------------------------------------------------------
    def _q_values(self, model: nn.Module, batch: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(q_t, q_tp1_online, q_tp1)`` per row: the online Q-values of ``obs``, the
        online Q-values of ``new_obs`` (detached; with ``double_q`` only) and the target
        network's Q-values of ``new_obs``."""
        if SampleBatch.SEQ_LENS in batch:
            return self._sequence_q_values(model, batch)
        obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
        q_t, q_tp1_online = model(obs), None
        with torch.no_grad():  # a batched forward with obs would double the backward's work
            if self.config.double_q:
                q_tp1_online = model(new_obs)
            target_device = next(self.target_model.parameters()).device
            q_tp1 = self.target_model(new_obs.to(target_device)).to(q_t.device)
        return q_t, q_tp1_online, q_tp1

    def _sequence_q_values(self, model: nn.Module, batch: dict[str, torch.Tensor]
                           ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """:meth:`_q_values` of a sequenced batch (a recurrent Q-network): both networks
        unrolled over each sequence and one step more, next-state Q-values read
        ``n_steps`` positions on (see the module docstring)."""
        q_all, layout = unroll_q(model, batch)
        if N_STEPS not in batch:
            raise ValueError("a sequenced DQN batch needs the n_steps column that "
                             "DQNPolicy.postprocess_trajectory writes")
        next_t = layout.row_t + batch[N_STEPS].long()
        if bool((next_t > layout.seq_lens[layout.row_seq]).any()):
            raise ValueError("an n-step transition reaches past the end of its sequence; "
                             "a recurrent policy's n-step returns must stop at sequence "
                             "ends (DQNPolicy.postprocess_trajectory does)")
        q_t = q_all[layout.row_seq, layout.row_t]
        q_tp1_online = (q_all.detach()[layout.row_seq, next_t] if self.config.double_q
                        else None)
        with torch.no_grad():
            target_device = next(self.target_model.parameters()).device
            target_batch = {k: v.to(target_device) for k, v in batch.items()}
            q_target, _ = unroll_q(self.target_model, target_batch)
            q_tp1 = q_target[layout.row_seq.to(target_device),
                             next_t.to(target_device)].to(q_t.device)
        return q_t, q_tp1_online, q_tp1

    def _td_error(self, model: nn.Module, batch: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(td_error, q_t)``: ``Q(s, a) - target`` per row (target detached) and the
        online Q-values of ``obs``."""
        cfg = self.config
        q_t, q_tp1_online, q_tp1 = self._q_values(model, batch)
        actions = batch[SampleBatch.ACTIONS].long().view(-1, 1)
        q_selected = q_t.gather(1, actions).squeeze(1)

        with torch.no_grad():
            if q_tp1_online is not None:
                best = q_tp1_online.argmax(dim=1, keepdim=True)
                q_tp1_best = q_tp1.gather(1, best).squeeze(1)
            else:
                q_tp1_best = q_tp1.max(dim=1).values
            not_done = 1.0 - batch[SampleBatch.TERMINATEDS].float()
            if N_STEPS in batch:
                discount = torch.pow(torch.full_like(q_tp1_best, cfg.gamma),
                                     batch[N_STEPS].float())
            else:
                discount = torch.full_like(q_tp1_best, cfg.gamma**cfg.n_step)
            target = batch[SampleBatch.REWARDS].float() + discount * not_done * q_tp1_best
        return q_selected - target, q_t

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """``mean(weights * huber(td_error))`` with the double-Q (or max) n-step target from
        the target network. Rows carry ``n_steps`` from postprocessing; without it the
        discount is ``gamma ** n_step`` (RLlib's rule). Missing ``weights`` count as 1. A
        sequenced batch (recurrent Q-network) is unrolled per sequence; the mean is over
        its real rows."""
        td_error, q_t = self._td_error(model, batch)
        weights = batch.get(SampleBatch.WEIGHTS)
        per_row = huber_loss(td_error, self.config.huber_threshold)
        if weights is not None:
            per_row = weights.float() * per_row
        loss = per_row.mean()
        q_stats = q_t.detach() if mask_layout(self.model) is None else legal_values(q_t.detach())
        stats = {
            "loss": loss.detach(),
            "mean_q": q_stats.mean(),
            "min_q": q_stats.min(),
            "max_q": q_stats.max(),
            "mean_td_error": td_error.detach().mean(),
            "cur_lr": self.optimizer.param_groups[0]["lr"],
        }
        return LossOutput(loss=loss, stats=stats, per_sample={"td_error": td_error.detach()})

    def compute_td_error(self, batch: SampleBatch) -> np.ndarray:
        """Per-row TD errors of ``batch`` with the current networks, without a gradient
        step (for initial replay priorities). A recurrent policy's trajectory that is not
        cut into sequences yet (a per-row ``state_in_*`` column) is unrolled as one
        sequence from its first row's state."""
        if self.is_recurrent and not batch.is_sequenced:
            batch = chop_into_sequences(batch, max(batch.count, 1))
        with torch.no_grad():
            td_error, _ = self._td_error(self.model, self.batch_to_tensors(batch))
        return td_error.cpu().numpy()

    # ---- training and the target network -------------------------------------------------
    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Gradients as in the base; the rows count toward the target sync when these
        gradients are applied to this policy."""
        grads, info = super().compute_gradients(batch)
        self._pending_rows += batch.count
        return grads, info

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        """One SGD step; returns ``learner_stats`` and per-row ``td_error``. Counts the rows
        toward the target-network sync."""
        self._pending_rows += batch.count
        info = super().learn_on_batch(batch)
        info["learner_stats"]["num_target_updates"] = float(self.num_target_updates)
        return info

    def after_update(self, num_updates: int) -> None:
        """Count the rows of the update just applied and sync the target network when
        ``target_network_update_freq`` rows were trained since the last sync."""
        rows = self._pending_rows or self.config.train_batch_size
        self._pending_rows = 0
        self.num_steps_trained += rows
        since = self.num_steps_trained - self.last_target_update_steps
        if since >= self.config.target_network_update_freq:
            self.update_target()

    def update_target(self) -> None:
        """Copy the online network into the target network."""
        self.target_model.load_state_dict(self.model.state_dict())
        self.last_target_update_steps = self.num_steps_trained
        self.num_target_updates += 1

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load online weights; on a rollout worker (``worker_index >= 1``) the target
        network follows them."""
        super().set_weights(weights)
        if self.config.worker_index >= 1:
            self.target_model.load_state_dict(self.model.state_dict())
