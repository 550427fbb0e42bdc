"""The torch policy contract shared by every algorithm.

A policy owns one ``torch.nn.Module`` (``self.model``) and its optimizer. Subclasses give
three things: how to build the model, how to act, and the loss as a function of a model
and a batch of tensors. Everything else (gradients as numpy, applying them, weights in and
out, optimizer state for checkpoints) lives here, so the learner can run the same loss on
several model replicas (towers) without knowing the algorithm.

Recurrent policies
    A policy whose model implements the recurrent interface
    (:class:`actorrl.policy.models.RecurrentModel`) is recurrent (:attr:`TorchPolicy.is_recurrent`).
    Its ``compute_actions`` takes the state of every env it acts for (``state``: one array
    per state tensor, ``[B, ...]``) and, where the model config asks for them, the previous
    actions and rewards; its extras then hold the state after the step as ``state_out_0``,
    ``state_out_1``... Samplers carry those to the next step, record the state input of
    every row as ``state_in_*`` for postprocessing, then cut each fragment into sequences of
    at most ``max_seq_len`` steps that keep only their start states
    (:func:`actorrl.data.batch.chop_into_sequences`). Losses unroll the model over those
    sequences (:mod:`actorrl.policy.recurrent`).

Policies import neither asyncio nor transport: plain code, plain tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from actorrl.config.loading import load_component
from actorrl.data.batch import SampleBatch
from actorrl.policy.config import PolicyConfig
from actorrl.policy.model_config import missing_recurrent_methods, resolve_model_config
from actorrl.policy.recurrent import RecurrentInputs, initial_state, step_model
from actorrl.policy.schedules import PiecewiseSchedule


@dataclass
class LossOutput:
    """What a loss function returns.

    ``loss``: the scalar to minimise. ``stats``: scalars for the learner stats (floats or
    0-d tensors). ``per_sample``: tensors with one row per sample that callers need back
    (DQN's ``td_error`` for replay priorities).
    """

    loss: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)


class TorchPolicy:
    """Base class of all torch policies. See the module docstring for the contract.

    ``config`` is the policy's :attr:`config_class` instance. A mapping is accepted too
    (an algorithm-style config with RLlib key names, e.g. a checkpoint's): it is loaded
    with :func:`actorrl.config.loading.load_component`, which refuses unknown keys. ``device``
    defaults to CPU; the learner builds its own copy on CUDA when present.
    """

    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig
    """The config dataclass this policy reads."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: PolicyConfig | Mapping[str, Any],
                 device: str | torch.device = "cpu") -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.config = load_component(self.config_class, config, section="policy")
        self.device = torch.device(device)
        self.global_timestep = 0
        self.model = self.make_model().to(self.device)
        self._optimizer: torch.optim.Optimizer | None = None
        lr_points = self.config.lr_schedule
        entropy_points = getattr(self.config, "entropy_coeff_schedule", None)
        self._lr_schedule = PiecewiseSchedule(lr_points) if lr_points else None
        self._entropy_schedule = PiecewiseSchedule(entropy_points) if entropy_points else None
        self.cur_lr: float = float(self.config.lr)
        """The learning rate now (``lr``, or ``lr_schedule`` at the global timestep)."""
        self.entropy_coeff: float = float(getattr(self.config, "entropy_coeff", 0.0))
        """The entropy weight now (``entropy_coeff`` or its schedule); losses read it."""
        self._apply_schedules()
        self.is_recurrent = not missing_recurrent_methods(self.model)
        """Whether the model is recurrent (see the module docstring)."""
        model_config = resolve_model_config(getattr(self.config, "model", None))
        self.max_seq_len = int(model_config["max_seq_len"])
        """Longest sequence of a recurrent policy's train batches (``model.max_seq_len``)."""
        self.recurrent_inputs = RecurrentInputs.from_model_config(model_config)
        """Whether a recurrent model reads the previous actions / rewards."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer, built on first use: building the first one in a process imports
        torch's compiler stack (seconds), which sampling-only workers never need."""
        if self._optimizer is None:
            self._optimizer = self.make_optimizer(self.model)
            self._set_optimizer_lr()
        return self._optimizer

    # ---- to implement -------------------------------------------------------------
    def make_model(self) -> torch.nn.Module:
        """Build the network (on CPU; the base moves it to ``self.device``)."""
        raise NotImplementedError

    def compute_actions(self, obs: np.ndarray, explore: bool = True
                        ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, plus extra per-row outputs to store in the
        sample batch (``action_logp``, ``vf_preds``, ``action_dist_inputs``...)."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> LossOutput:
        """The training loss of ``model`` on ``batch`` (tensors on the model's device)."""
        raise NotImplementedError

    # ---- optional hooks -----------------------------------------------------------
    def make_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The optimizer; Adam with ``config.lr`` unless overridden. (``foreach``: one
        kernel per step for all parameters; torch leaves it off on the CPU, where it
        saves ~40% of a small model's optimizer step.)"""
        return torch.optim.Adam(model.parameters(), lr=self.config.lr, foreach=True)

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Per-trajectory processing on the rollout worker (n-step, GAE...). ``batch`` holds
        one contiguous fragment of one episode of one env, in time order. Its last row ends
        the episode when ``terminateds[-1]`` (no bootstrap) or ``truncateds[-1]`` (time
        limit: bootstrap from ``new_obs[-1]``); otherwise the fragment was cut mid-episode
        and also bootstraps from ``new_obs[-1]``."""
        return batch

    def on_global_timestep(self, timestep: int) -> None:
        """Told the global env-step count (epsilon, lr and entropy schedules). Subclasses
        that override it call this."""
        self.global_timestep = timestep
        self._apply_schedules()

    def _apply_schedules(self) -> None:
        """``cur_lr`` and ``entropy_coeff`` at ``global_timestep`` (RLlib's
        LearningRateSchedule and EntropyCoeffSchedule mixins)."""
        if self._lr_schedule is not None:
            self.cur_lr = self._lr_schedule.value(self.global_timestep)
            self._set_optimizer_lr()
        if self._entropy_schedule is not None:
            self.entropy_coeff = self._entropy_schedule.value(self.global_timestep)

    def _set_optimizer_lr(self) -> None:
        """The optimizer's param groups learn at ``cur_lr`` (``lr``, or ``lr_schedule``
        at the global timestep); also after :meth:`set_state` loaded an optimizer state,
        which carries the lr of the run that saved it."""
        if self._optimizer is not None:
            for group in self._optimizer.param_groups:
                group["lr"] = self.cur_lr

    def after_update(self, num_updates: int) -> None:
        """Called after every applied update (e.g. target network sync)."""

    # ---- provided -----------------------------------------------------------------
    def get_initial_state(self) -> list[np.ndarray]:
        """A recurrent policy's state at an episode's start (one env's: an array per state
        tensor, no batch dimension); ``[]`` for a feed-forward policy."""
        return initial_state(self.model) if self.is_recurrent else []

    def recurrent_step(self, obs: torch.Tensor, state: Any, prev_actions: Any,
                       prev_rewards: Any
                       ) -> tuple[torch.Tensor, torch.Tensor, dict[str, np.ndarray]]:
        """One step of the recurrent model for a batch of envs (``state`` etc. as given to
        ``compute_actions``): ``(outputs, values, {state_out_k: array})``."""
        if state is None:
            raise ValueError("a recurrent policy acts with a state: pass state= (start "
                             "from get_initial_state())")
        inputs = self.recurrent_inputs
        if inputs.prev_actions and prev_actions is None:
            raise ValueError("model option 'lstm_use_prev_action' is set: pass prev_actions=")
        if inputs.prev_rewards and prev_rewards is None:
            raise ValueError("model option 'lstm_use_prev_reward' is set: pass prev_rewards=")
        device = self.device
        # as_tensor on a CPU device views the arrays (no copy)
        state_t = [torch.as_tensor(s, device=device) for s in state]
        outputs, values, state_out = step_model(
            self.model, obs, state_t,
            torch.as_tensor(prev_actions, device=device) if inputs.prev_actions else None,
            torch.as_tensor(np.asarray(prev_rewards, dtype=np.float32), device=device)
            if inputs.prev_rewards else None)
        return outputs, values, {f"{SampleBatch.STATE_OUT}{i}": s.detach().cpu().numpy()
                                 for i, s in enumerate(state_out)}

    def batch_to_tensors(self, batch: SampleBatch,
                         device: torch.device | None = None) -> dict[str, torch.Tensor]:
        """Columns as tensors on ``device`` (default: the policy's), zero-copy on CPU."""
        device = device or self.device
        out = {}
        for key, value in batch.items():
            if value.dtype.kind in "biuf":
                out[key] = torch.as_tensor(value, device=device)
        return out

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Gradients of the loss on ``batch`` as numpy arrays (one per parameter), and info
        with ``batch_count`` and ``learner_stats``."""
        self.model.train()
        # The model's zero_grad, not the optimizer's: a worker that only computes gradients
        # (A3C) never builds an optimizer, and so never imports torch's compiler stack.
        self.model.zero_grad(set_to_none=True)
        out = self.loss(self.model, self.batch_to_tensors(batch))
        out.loss.backward()
        grads = [
            (p.grad.detach().cpu().numpy().copy() if p.grad is not None
             else np.zeros(tuple(p.shape), dtype=np.float32))
            for p in self.model.parameters()
        ]
        info = {"batch_count": batch.count, "learner_stats": _to_floats(out.stats)}
        return grads, info

    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        """Apply gradients computed by :meth:`compute_gradients` (possibly elsewhere)."""
        params = list(self.model.parameters())
        if len(grads) != len(params):
            raise ValueError(f"got {len(grads)} gradients for {len(params)} parameters")
        for p, g in zip(params, grads):
            p.grad = torch.as_tensor(np.asarray(g), device=self.device).view_as(p).clone()
        self._clip_and_step()

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, Any]:
        """One SGD step on ``batch``. Returns ``learner_stats`` and per-sample outputs
        (e.g. ``td_error``) as numpy arrays."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        out = self.loss(self.model, self.batch_to_tensors(batch))
        out.loss.backward()
        self._clip_and_step()
        info: dict[str, Any] = {"learner_stats": _to_floats(out.stats)}
        for key, value in out.per_sample.items():
            info[key] = value.detach().cpu().numpy()
        return info

    def _clip_and_step(self) -> None:
        clip = self.config.grad_clip
        if clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(clip))
        self.optimizer.step()
        self.num_updates = getattr(self, "num_updates", 0) + 1
        self.after_update(self.num_updates)

    def get_weights(self, acting_only: bool = False) -> dict[str, np.ndarray]:
        """Model parameters and buffers as numpy arrays (copies, safe to send); with
        ``acting_only`` just those :meth:`acting_weight_names` names (what a rollout
        worker needs)."""
        names = self.acting_weight_names() if acting_only else None
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()
                if names is None or k in names}

    def acting_weight_names(self) -> frozenset[str] | None:
        """The model weights that acting and a rollout worker's postprocessing read, when
        they are fewer than all (an off-policy actor without its critics); None: all."""
        return None

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load weights produced by :meth:`get_weights`: all of the model's, or exactly its
        :meth:`acting_weight_names` (the rest is left as it is)."""
        state = {k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()}
        names = self.model.state_dict().keys()
        if state.keys() == names:
            self.model.load_state_dict(state)
            return
        acting = self.acting_weight_names()
        if acting is None or set(state) != acting:
            missing = sorted(set(names) - set(state))
            unknown = sorted(set(state) - set(names))
            raise ValueError(f"weights do not fit this policy's model: missing {missing[:5]}, "
                             f"unknown {unknown[:5]}; were they saved by a policy with "
                             "another model config?")
        self.model.load_state_dict(state, strict=False)

    def get_state(self) -> dict[str, Any]:
        """Weights, optimizer state and counters, for checkpoints."""
        return {
            "weights": self.get_weights(),
            "optimizer": _tensors_to_numpy(self.optimizer.state_dict()),
            "global_timestep": self.global_timestep,
            "num_updates": getattr(self, "num_updates", 0),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned; the optimizer then learns at this
        policy's configured ``lr`` (or ``lr_schedule``), not the saved one."""
        self.set_weights(state["weights"])
        self.optimizer.load_state_dict(_numpy_to_tensors(state["optimizer"]))
        self.global_timestep = int(state.get("global_timestep", 0))
        self._apply_schedules()
        self._set_optimizer_lr()  # this config's lr, not the saved param groups' lr
        self.num_updates = int(state.get("num_updates", 0))


def _to_floats(stats: dict[str, Any]) -> dict[str, float]:
    return {k: float(v.detach().cpu()) if isinstance(v, torch.Tensor) else float(v)
            for k, v in stats.items()}


def _tensors_to_numpy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: _tensors_to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_tensors_to_numpy(v) for v in obj]
    return obj


def _numpy_to_tensors(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        # A copy: the optimizer updates its state in place, and arrays that arrived from
        # another process may be read-only shared memory (writing them is a SIGSEGV).
        return torch.tensor(obj)
    if isinstance(obj, dict):
        # state_dict keys for param groups are ints; msgpack may have turned them to ints
        return {k: _numpy_to_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_numpy_to_tensors(v) for v in obj]
    return obj
