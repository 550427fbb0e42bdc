"""Env creation: a gymnasium id, a ``"pkg.module:factory"`` path or a callable made into an
env (:func:`make_env`), and the :class:`MultiAgentEnv` protocol (see :mod:`actorrl.envs`)."""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from actorrl.envs.atari import INSTALL_HINT, is_atari_id, make_atari, register_ale
from actorrl.envs.custom.memory import register_memory_envs
from actorrl.envs.custom.partial import register_partial_envs
from actorrl.envs.pettingzoo_env import (
    is_pettingzoo_env,
    is_pettingzoo_spec,
    make_pettingzoo,
    wrap_pettingzoo,
)
from actorrl.envs.protocol import ALL_AGENTS, MultiAgentEnv  # noqa: F401 (re-exported)
from actorrl.envs.retired import check_mujoco_installed, current_env_id
from actorrl.util.classpath import resolve_callable

register_partial_envs()
register_memory_envs()


class EnvContext(dict):
    """The ``env_config`` dict handed to env factories, plus where the env runs.

    ``worker_index`` is 0 for the local worker and 1..N for remote ones; ``vector_index``
    is the env's index inside its worker's vector; ``num_workers`` counts remote workers.
    """

    def __init__(self, env_config: Mapping[str, Any] | None = None, *, worker_index: int = 0,
                 vector_index: int = 0, num_workers: int = 0) -> None:
        super().__init__(env_config or {})
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.num_workers = num_workers


EnvSpec = str | Callable[[EnvContext], Any]
"""A gymnasium id, a ``"pkg.module:factory"`` path, or a factory callable."""


def make_env(spec: EnvSpec, env_config: Mapping[str, Any] | None = None, *,
             worker_index: int = 0, vector_index: int = 0, num_workers: int = 0) -> Any:
    """Build one env (``gym.Env`` or :class:`MultiAgentEnv`) from ``spec``; PettingZoo
    envs (a ``pettingzoo.*`` module path, or a factory returning one) are wrapped as
    :class:`MultiAgentEnv` (:mod:`actorrl.envs.pettingzoo_env`).

    Raises ``ValueError`` naming the problem: an unknown gymnasium id (with close matches
    from gymnasium's registry), a bad ``"pkg.module:factory"`` path, or a factory that
    returned something that is not an env.
    """
    context = EnvContext(env_config, worker_index=worker_index, vector_index=vector_index,
                         num_workers=num_workers)
    if callable(spec):
        return _check_env(spec(context), spec)
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"env must be a gymnasium id, a 'pkg.module:factory' path or a "
                         f"callable, got {spec!r}")
    if is_pettingzoo_spec(spec):
        return make_pettingzoo(spec, env_config)
    if ":" in spec:
        module_name, _, name = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ValueError(f"env {spec!r}: cannot import module {module_name!r} ({exc})"
                             ) from exc
        if hasattr(module, name) or name not in gym.envs.registry:
            factory = resolve_callable(spec, "env factory")
            return _check_env(factory(context), spec)
        spec = name  # gymnasium's "module:EnvId": built as the id (Atari preprocessing...)
    spec = current_env_id(spec)
    check_mujoco_installed(spec)
    if spec not in gym.envs.registry and spec.startswith("ALE/") and not register_ale():
        raise ValueError(f"env {spec!r} is an Atari game and needs ale-py, which is not "
                         f"installed: {INSTALL_HINT}")
    if is_atari_id(spec):
        return make_atari(spec, dict(env_config or {}))
    if spec.startswith("MinAtar/") and spec not in gym.envs.registry:
        register_minatar()
    if spec not in gym.envs.registry:
        close = difflib.get_close_matches(spec, list(gym.envs.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown environment id {spec!r} (not in gymnasium's registry, and "
                         f"not a 'pkg.module:factory' path){hint}")
    return gym.make(spec, **dict(env_config or {}))


MINATAR_HINT = "pip install -e '.[minatar]' (or pip install minatar)"


def register_minatar() -> None:
    """Register the MinAtar games (``MinAtar/Breakout-v0`` ..., ``-v1`` with the minimal
    action set) with gymnasium; ``ValueError`` naming the extra when ``minatar`` is not
    installed."""
    try:
        from minatar.gym import register_envs
    except ImportError:
        raise ValueError(f"MinAtar ids need the minatar package, which is not installed: "
                         f"{MINATAR_HINT}") from None
    if not any(name.startswith("MinAtar/") for name in gym.envs.registry):
        register_envs()
    # -v0 is chosen on purpose (the full action set the MinAtar paper's agents used), so
    # gymnasium's "out of date, -v1 exists" warning on every make is noise.
    warnings.filterwarnings("ignore", message=r".*MinAtar/\S+-v0 is out of date",
                            category=DeprecationWarning)


def _check_env(env: Any, spec: Any) -> Any:
    if isinstance(env, (gym.Env, MultiAgentEnv)):
        return env
    if is_pettingzoo_env(env):
        return wrap_pettingzoo(env)
    raise ValueError(f"env factory {spec!r} returned {type(env).__name__}, expected a "
                     f"gymnasium.Env or an actorrl.envs.MultiAgentEnv")


