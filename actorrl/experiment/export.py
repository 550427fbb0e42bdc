"""``actorrl export``: a checkpoint's greedy policy as an ONNX, TorchScript or safetensors file.

ONNX and TorchScript files hold the whole greedy policy as one graph (:class:`GreedyPolicy`):

inputs
    ``obs`` ``[B, *obs_shape]``: observations as the env returns them (``Dict``/``Tuple``
    observations flattened as :mod:`actorrl.data.spaces` does), in the observation space's
    dtype (float32 for ``Discrete``-free vectors, uint8 for Atari frames); a recurrent
    policy also takes ``state_in_0``... ``[B, cell]`` (zeros at an episode's start) and,
    when its model reads them, ``prev_actions`` ``[B]`` (int64) or ``[B, n]`` and
    ``prev_rewards`` ``[B]`` (float32).
outputs
    ``action`` ``[B]`` (int64 for ``Discrete``) or ``[B, n]``: the greedy action (argmax of
    the logits or Q-values, the mean of a Gaussian, SAC's ``tanh`` of its mean, DDPG's
    actor) as the env
    takes it (a ``Box`` action mapped onto the space's bounds or clipped, as the
    checkpoint's ``normalize_actions`` / ``clip_actions`` say); ``action_dist_inputs``
    (the logits, or a Gaussian's means and log stds) or, for DQN and Ape-X, ``q_values``
    (for DDPG and TD3, ``actor_actions``: the actor's output in [-1, 1]); a recurrent
    policy's ``state_out_0``...
The checkpoint's ``MeanStdFilter`` (its mean, std and clip) is part of the graph, so
consumers feed raw observations. The batch dimension is dynamic.

A safetensors file holds the model's weights alone (``model.state_dict()``, the names as
the model class defines them; see the export docs for the default models in plain torch)
and, as the file's metadata, ``actorrl`` (JSON: algorithm, env, spaces, model config and
the observation filter's mean, std and clip).

Every file records the actorrl version, algorithm and env (ONNX metadata properties,
TorchScript's ``actorrl.json`` extra file, the safetensors metadata).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from actorrl.algorithms.checkpoints import read_checkpoint
from actorrl.data.batch import DEFAULT_POLICY_ID
from actorrl.envs.filters import STD_EPSILON
from actorrl.experiment.errors import UsageError
from actorrl.experiment.extras import import_extra, require_extra
from actorrl.experiment.inference import Policy, load_policy
from actorrl.policy.recurrent import step_model
from actorrl.util.files import jsonable

FORMATS: dict[str, str] = {"onnx": ".onnx", "torchscript": ".pt", "safetensors": ".safetensors"}
"""Export format -> the default file suffix."""
FORMAT_EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "onnx": (("onnx", "onnxscript"), "onnx"),
    "safetensors": (("safetensors",), "safetensors"),
}
"""Format -> (modules it needs, the extra that installs them); TorchScript needs torch only."""
EXAMPLE_BATCH = 2
"""Rows of the example input the graph is traced with (the batch axis stays dynamic)."""


def filter_stats(policy: Policy) -> dict[str, Any] | None:
    """The checkpoint's observation filter as plain numbers: ``{"name", "mean", "std",
    "clip"}`` for a ``MeanStdFilter`` (``std`` without its epsilon), None for none."""
    from actorrl.envs.filters import MeanStdFilter, filter_shape, make_filter

    config = policy.config
    name = (config.get("rollout") or {}).get("observation_filter",
                                             config.get("observation_filter", "NoFilter"))
    if name == "NoFilter":
        return None
    _, state = read_checkpoint(policy.checkpoint)
    obs_filter = make_filter(name, filter_shape(policy.observation_space))
    saved = (state.get("filters") or {}).get(DEFAULT_POLICY_ID)
    if not isinstance(obs_filter, MeanStdFilter) or saved is None:
        return None
    obs_filter.set_state(saved)
    return {"name": name, "mean": np.asarray(obs_filter.rs.mean, np.float64).tolist(),
            "std": np.asarray(obs_filter.rs.std, np.float64).tolist(),
            "clip": obs_filter.clip}


class GreedyPolicy(nn.Module):
    """A policy's greedy action as one module: the observation filter, the model and the
    argmax / mode (see the module docstring for its inputs and outputs)."""

    def __init__(self, policy: Policy, stats: dict[str, Any] | None) -> None:
        super().__init__()
        torch_policy = policy.torch_policy
        self.model = torch_policy.model
        self.recurrent = policy.is_recurrent
        self.kind = policy_kind(policy)
        self.dist_class = getattr(torch_policy, "dist_class", None)
        inputs = getattr(torch_policy, "recurrent_inputs", None)
        self.prev_actions = bool(self.recurrent and inputs and inputs.prev_actions)
        self.prev_rewards = bool(self.recurrent and inputs and inputs.prev_rewards)
        self.num_states = len(policy.get_initial_state())
        self.filtered = stats is not None
        self.clip = None if stats is None else stats["clip"]
        self.action_mode = _action_mode(policy)
        if self.action_mode != "none":
            space = policy.action_space
            self.register_buffer("action_low", torch.as_tensor(space.low))
            self.register_buffer("action_high", torch.as_tensor(space.high))
        if stats is not None:
            self.register_buffer("filter_mean", torch.tensor(stats["mean"],
                                                             dtype=torch.float32))
            self.register_buffer("filter_scale", torch.tensor(
                np.asarray(stats["std"]) + STD_EPSILON, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(action, outputs, *state_out)`` for ``obs`` (and a recurrent policy's
        ``*state_in, [prev_actions], [prev_rewards]``)."""
        if self.filtered:
            obs = (obs.to(torch.float32) - self.filter_mean) / self.filter_scale
            if self.clip is not None:
                obs = obs.clamp(-self.clip, self.clip)
        state_out: list[torch.Tensor] = []
        if self.recurrent:
            state = list(inputs[:self.num_states])
            rest = list(inputs[self.num_states:])
            prev_a = rest.pop(0) if self.prev_actions else None
            prev_r = rest.pop(0) if self.prev_rewards else None
            outputs, _, state_out = step_model(self.model, obs, state, prev_a, prev_r)
        elif self.kind == DISTRIBUTION:
            policy_outputs = getattr(self.model, "policy_outputs", None)
            outputs = policy_outputs(obs) if policy_outputs else self.model(obs)[0]
        else:
            outputs = self.model(obs)
        if self.kind == DISTRIBUTION:
            action = self.dist_class(outputs).deterministic_sample()
        elif self.kind == SQUASHED_GAUSSIAN:
            action = torch.tanh(torch.chunk(outputs, 2, dim=-1)[0])  # tanh of the mean
        elif self.kind == DETERMINISTIC:
            action = outputs
        else:  # Q-values or a categorical's logits
            action = outputs.argmax(dim=-1)
        return (self._env_action(action), outputs, *state_out)

    def _env_action(self, action: torch.Tensor) -> torch.Tensor:
        """The policy's action as the env takes it (see :func:`_action_mode`)."""
        if self.action_mode == "unsquash":
            low, high = self.action_low.double(), self.action_high.double()
            scaled = low + (action.double() + 1.0) * (high - low) / 2.0
            return torch.minimum(torch.maximum(scaled, low), high).to(self.action_low.dtype)
        if self.action_mode == "shift":
            return (self.action_low + action).to(self.action_low.dtype)
        if self.action_mode == "clip":
            return torch.minimum(torch.maximum(action, self.action_low), self.action_high)
        return action


DISTRIBUTION, Q_VALUES, SQUASHED_GAUSSIAN, LOGITS, DETERMINISTIC = (
    "distribution", "q_values", "squashed_gaussian", "logits", "deterministic")
"""What a policy's model outputs (see :func:`policy_kind`)."""


def policy_kind(policy: Policy) -> str:
    """What the policy's model outputs, which decides the greedy action: ``distribution``
    (actor-critic policies: the inputs of their action distribution, whose mode is the
    action), ``q_values`` (DQN, Ape-X: the argmax), ``squashed_gaussian`` (SAC on a
    ``Box``: ``tanh`` of the mean) or ``logits`` (SAC on ``Discrete``: the argmax).
    :class:`UsageError` for a policy :func:`export_policy` does not know."""
    from actorrl.policy.ddpg import DDPGPolicy
    from actorrl.policy.dqn import DQNPolicy
    from actorrl.policy.sac import SACPolicy

    torch_policy = policy.torch_policy
    if getattr(torch_policy, "dist_class", None) is not None:
        return DISTRIBUTION
    if isinstance(torch_policy, DQNPolicy):
        return Q_VALUES
    if isinstance(torch_policy, SACPolicy):
        return LOGITS if getattr(torch_policy.model, "discrete", False) else SQUASHED_GAUSSIAN
    if isinstance(torch_policy, DDPGPolicy):
        return DETERMINISTIC
    raise UsageError(f"actorrl export does not know {policy.algorithm}'s policy "
                     f"({type(torch_policy).__name__}): it exports actor-critic policies "
                     "(PPO, APPO, IMPALA, A2C, A3C), DQN / Ape-X, SAC and DDPG / TD3; "
                     "actorrl.load_policy runs any checkpoint's policy in Python")


def _action_mode(policy: Policy) -> str:
    """How the graph maps the policy's action onto the env's, as the checkpoint's workers
    did (:func:`actorrl.data.actions.env_actions`): ``unsquash`` ([-1, 1] onto a bounded
    float ``Box``), ``shift`` (an integer ``Box``), ``clip`` or ``none``."""
    import gymnasium as gym

    from actorrl.data.actions import is_bounded_box

    space, options = policy.action_space, policy.action_options
    if not isinstance(space, gym.spaces.Box):
        return "none"
    integer = bool(np.issubdtype(space.dtype, np.integer))
    if options["normalize"] and is_bounded_box(space):
        return "shift" if integer else "unsquash"
    if not options["normalize"] and options["clip"] and not integer:
        return "clip"
    return "none"


def greedy_module(policy: Policy) -> GreedyPolicy:
    """The :class:`GreedyPolicy` of ``policy``, in eval mode."""
    return GreedyPolicy(policy, filter_stats(policy)).eval()


def input_names(policy: Policy) -> list[str]:
    """The graph's input names, in order (see the module docstring)."""
    names = ["obs"]
    if policy.is_recurrent:
        names += [f"state_in_{i}" for i in range(len(policy.get_initial_state()))]
        inputs = policy.torch_policy.recurrent_inputs
        names += ["prev_actions"] if inputs.prev_actions else []
        names += ["prev_rewards"] if inputs.prev_rewards else []
    return names


def output_names(policy: Policy) -> list[str]:
    """The graph's output names, in order (see the module docstring)."""
    outputs = {Q_VALUES: "q_values", DETERMINISTIC: "actor_actions"}.get(
        policy_kind(policy), "action_dist_inputs")
    names = ["action", outputs]
    if policy.is_recurrent:
        names += [f"state_out_{i}" for i in range(len(policy.get_initial_state()))]
    return names


def example_inputs(policy: Policy, batch: int = EXAMPLE_BATCH) -> tuple[Any, ...]:
    """Inputs of the graph for ``batch`` rows: sampled observations, start states, zero
    previous actions and rewards (torch tensors)."""
    rows = [policy.observation_space.sample() for _ in range(batch)]
    from actorrl.data.spaces import observation_preprocessor

    prep = observation_preprocessor(policy.observation_space)
    obs = np.stack([prep(o) for o in rows] if prep is not None else rows)
    tensors = [torch.as_tensor(obs)]
    if policy.is_recurrent:
        tensors += [torch.as_tensor(np.stack([s] * batch)) for s in policy.get_initial_state()]
        inputs = policy.torch_policy.recurrent_inputs
        if inputs.prev_actions:
            tensors.append(torch.as_tensor(np.stack([policy.zero_action()] * batch)))
        if inputs.prev_rewards:
            tensors.append(torch.zeros(batch, dtype=torch.float32))
    return tuple(tensors)


def export_metadata(policy: Policy, fmt: str) -> dict[str, Any]:
    """What every exported file records about where it came from and what it computes
    (``model``: the policy's model config with every default filled in)."""
    from actorrl import __version__
    from actorrl.policy.model_config import resolve_model_config

    model = jsonable(resolve_model_config(getattr(policy.torch_policy.config, "model", None)))
    return {"format": f"actorrl-policy-{fmt}", "actorrl_version": __version__,
            "algorithm": policy.algorithm, "env": policy.env,
            "checkpoint": policy.checkpoint,
            "observation_space": repr(policy.observation_space),
            "action_space": repr(policy.action_space),
            "model": model, "recurrent": policy.is_recurrent,
            "inputs": input_names(policy), "outputs": output_names(policy),
            "observation_filter": filter_stats(policy)}


def default_output(policy: Policy, fmt: str) -> Path:
    """``<checkpoint folder>/policy<suffix>``."""
    return Path(policy.checkpoint) / f"policy{FORMATS[fmt]}"


def export_policy(path: str | os.PathLike[str], fmt: str,
                  output: str | os.PathLike[str] | None = None) -> Path:
    """Export the policy of the checkpoint at ``path`` (a checkpoint folder, or a results
    folder: its latest checkpoint) as ``fmt`` (one of :data:`FORMATS`) to ``output``
    (default :func:`default_output`); returns the file written. :class:`UsageError` for an
    unknown format, a missing extra or a checkpoint that cannot be read."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt in FORMAT_EXTRAS:
        modules, extra = FORMAT_EXTRAS[fmt]
        require_extra(modules, extra, f"--format {fmt}")
    policy = load_policy(path)
    out = Path(output) if output is not None else default_output(policy, fmt)
    if out.parent and not out.parent.is_dir():
        raise UsageError(f"cannot write {str(out)!r}: folder {str(out.parent)!r} does not "
                         "exist")
    writer = {"onnx": write_onnx, "torchscript": write_torchscript,
              "safetensors": write_safetensors}[fmt]
    writer(policy, out)
    return out


def write_safetensors(policy: Policy, out: Path) -> None:
    """The model's weights and the metadata (see the module docstring) to ``out``."""
    save_file = import_extra("safetensors.torch", "safetensors", "--format safetensors"
                             ).save_file
    weights = {k: v.detach().cpu().contiguous()
               for k, v in policy.torch_policy.model.state_dict().items()}
    save_file(weights, str(out),
              metadata={"actorrl": json.dumps(export_metadata(policy, "safetensors"))})


def write_torchscript(policy: Policy, out: Path) -> None:
    """The traced :class:`GreedyPolicy` to ``out`` (load it with ``torch.jit.load``)."""
    module = greedy_module(policy)
    with warnings.catch_warnings():
        # torch >= 2.10 calls TorchScript deprecated; torch.jit.load still reads the file.
        warnings.simplefilter("ignore")
        with torch.no_grad():
            traced = torch.jit.trace(module, example_inputs(policy), check_trace=False)
        traced = torch.jit.freeze(traced)  # weights as constants: outputs need no grad
        extra = {"actorrl.json": json.dumps(export_metadata(policy, "torchscript"))}
        torch.jit.save(traced, str(out), _extra_files=extra)


def _dynamic_batch(args: tuple[Any, ...], batch: Any) -> tuple[Any, ...]:
    """``torch.export``'s dynamic shapes for ``forward(obs, *inputs)``: axis 0 of every
    input (the varargs are one element of the structure, absent when empty)."""
    if len(args) == 1:
        return ({0: batch},)
    return ({0: batch}, tuple({0: batch} for _ in args[1:]))


def write_onnx(policy: Policy, out: Path) -> None:
    """:class:`GreedyPolicy` through torch's ONNX exporter (``torch.export``-based, batch
    axis dynamic) to ``out``, with the metadata as the model's metadata properties."""
    onnx = import_extra("onnx", "onnx", "--format onnx")
    module = greedy_module(policy)
    args = example_inputs(policy)
    batch = torch.export.Dim("batch", min=1)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # "torchvision is not installed" lines
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, input_names=input_names(policy),
                                    output_names=output_names(policy),
                                    dynamic_shapes=_dynamic_batch(args, batch),
                                    dynamo=True, verbose=False)
    exporter_log.setLevel(level)
    model = program.model_proto
    for key, value in export_metadata(policy, "onnx").items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, json.dumps(value)
    onnx.save(model, str(out))
