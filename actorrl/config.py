"""Typed algorithm configs with RLlib's key names, loaded and validated with clear errors.

Each algorithm has one frozen, keyword-only dataclass (``ApexConfig``, ``ImpalaConfig``...)
built on :class:`AlgorithmConfig`. :func:`load_config` builds one from a mapping (a YAML or
JSON file, ``--set key=value`` overrides), rejecting unknown keys with close-match
suggestions and reporting every problem at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from transport.error_types import register_error

C = TypeVar("C", bound="AlgorithmConfig")


@register_error  # a coordinator's ConfigError reaches a client as ConfigError
class ConfigError(ValueError):
    """A config has unknown keys or invalid values; the message lists them all."""


def _model_default() -> dict[str, Any]:
    return {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"}


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """Settings shared by every algorithm (RLlib names)."""

    env: str = "CartPole-v1"
    """Gymnasium id or ``"pkg.module:factory"``."""
    env_config: dict[str, Any] = field(default_factory=dict)
    """Passed to the env factory / ``gymnasium.make``."""
    num_workers: int = 2
    """Rollout worker processes."""
    num_envs_per_worker: int = 1
    """Envs per worker, stepped together with one batched forward pass."""
    rollout_fragment_length: int = 50
    """Env steps per env per ``sample()`` (RLlib's sample_batch_size)."""
    batch_mode: str = "truncate_episodes"
    """``truncate_episodes`` or ``complete_episodes``."""
    train_batch_size: int = 500
    """Rows per SGD step."""
    gamma: float = 0.99
    """Discount factor."""
    lr: float = 5e-4
    """Learning rate."""
    grad_clip: float | None = 40.0
    """Global gradient-norm clip (None: no clipping)."""
    model: dict[str, Any] = field(default_factory=_model_default)
    """Model settings: fcnet_hiddens, fcnet_activation, custom_model, custom_model_config."""
    multiagent: dict[str, Any] = field(default_factory=dict)
    """policies, policy_mapping_fn, policies_to_train."""
    num_gpus: float = 0.0
    """GPUs for the learner (towers); 0 = CPU."""
    _fake_gpus: bool = False
    """Build ``num_gpus`` learner towers on the CPU (testing)."""
    seed: int | None = None
    """Seed for envs and torch (per worker: seed + worker index)."""
    min_iter_time_s: float = 2.0
    """Minimum wall time of one training iteration (one result)."""
    timesteps_per_iteration: int = 0
    """Minimum env steps sampled per iteration."""
    metrics_smoothing_episodes: int = 100
    """Episodes averaged in episode_reward_mean."""
    debug: bool = False
    """Report extra pipeline stats (timing breakdown, pending tasks)."""

    def __post_init__(self) -> None:
        problems = self.validate()
        if problems:
            raise ConfigError(f"invalid {type(self).__name__}:\n  - " + "\n  - ".join(problems))

    def validate(self) -> list[str]:
        """Every problem with the values (empty when valid); subclasses extend it."""
        problems = []

        def positive(key: str, allow_zero: bool = False) -> None:
            value = getattr(self, key)
            if value < 0 or (value == 0 and not allow_zero):
                bound = ">= 0" if allow_zero else "> 0"
                problems.append(f"{key} must be {bound}, got {value!r}")

        positive("num_workers", allow_zero=True)
        positive("num_envs_per_worker")
        positive("rollout_fragment_length")
        positive("train_batch_size")
        positive("lr")
        positive("num_gpus", allow_zero=True)
        positive("min_iter_time_s", allow_zero=True)
        positive("timesteps_per_iteration", allow_zero=True)
        positive("metrics_smoothing_episodes")
        if not 0 <= self.gamma <= 1:
            problems.append(f"gamma must be in [0, 1], got {self.gamma!r}")
        if self.batch_mode not in ("truncate_episodes", "complete_episodes"):
            problems.append(f"batch_mode must be 'truncate_episodes' or 'complete_episodes', "
                            f"got {self.batch_mode!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            problems.append(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        """All settings as a plain dict (for workers, policies and results folders)."""
        return dataclasses.asdict(self)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied (validated)."""
        return load_config(type(self), {**self.to_dict(), **changes})


def config_fields(cls: type[AlgorithmConfig]) -> dict[str, dataclasses.Field]:
    """The config's fields by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def _check_type(key: str, value: Any, annotation: Any) -> tuple[Any, str | None]:
    """Coerce ``value`` to ``annotation`` where that is lossless; else return a problem."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None, None
        for arg in args:
            if arg is type(None):
                continue
            coerced, problem = _check_type(key, value, arg)
            if problem is None:
                return coerced, None
        names = " or ".join("None" if a is type(None) else getattr(a, "__name__", str(a))
                            for a in args)
        return value, f"{key} must be {names}, got {value!r} ({type(value).__name__})"
    target = origin or annotation
    if target is Any:
        return value, None
    if target is bool:
        if isinstance(value, bool):
            return value, None
        return value, f"{key} must be true or false, got {value!r}"
    if target is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        return value, f"{key} must be an integer, got {value!r} ({type(value).__name__})"
    if target is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return value, f"{key} must be a number, got {value!r} ({type(value).__name__})"
    if target is str:
        if isinstance(value, str):
            return value, None
        return value, f"{key} must be a string, got {value!r} ({type(value).__name__})"
    if target is dict:
        if isinstance(value, dict):
            return value, None
        return value, f"{key} must be a mapping, got {value!r} ({type(value).__name__})"
    if target is list:
        if isinstance(value, (list, tuple)):
            return list(value), None
        return value, f"{key} must be a list, got {value!r} ({type(value).__name__})"
    return value, None


def load_config(cls: type[C], values: dict[str, Any]) -> C:
    """Build ``cls`` from ``values``, reporting unknown keys (with suggestions), wrong
    types and invalid values all at once as a :class:`ConfigError`."""
    fields = config_fields(cls)
    hints = typing.get_type_hints(cls)
    problems = []
    clean: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields and f"{key}_" in fields:  # RLlib keys that are Python keywords
            key = f"{key}_"
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            problems.append(f"unknown config key {key!r} for {cls.__name__}{hint}")
            continue
        if key.startswith("_") and not key.startswith("_fake"):
            problems.append(f"unknown config key {key!r} for {cls.__name__}")
            continue
        coerced, problem = _check_type(key, value, hints[key])
        if problem:
            problems.append(problem)
        else:
            clean[key] = coerced
    if problems:
        raise ConfigError(f"invalid {cls.__name__}:\n  - " + "\n  - ".join(problems))
    return cls(**clean)


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> (key, value) with the value parsed as JSON when it is valid JSON
    (numbers, true/false, null, lists, objects) and kept as a string otherwise."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        lowered = raw.strip().lower()
        value = {"true": True, "false": False, "none": None}.get(lowered, raw)
    return key.strip(), value


def read_config_file(path: str) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON config file into a dict."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist")
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {path!r} is not valid JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of keys to values")
    return data
