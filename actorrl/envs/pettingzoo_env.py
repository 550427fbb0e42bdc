"""PettingZoo envs as actorrl :class:`~actorrl.envs.MultiAgentEnv` s (the ``pettingzoo`` extra).

Env specs
    ``env: pettingzoo.classic.connect_four_v3`` (any module path starting with
    ``pettingzoo.``, or another module with an ``env`` / ``parallel_env`` function and a
    ``":"``-free name given as ``pettingzoo:pkg.module``): the module's ``parallel_env()``
    is called when it has one, else its ``env()``, with ``env_config`` as keyword arguments.
    A ``"pkg.module:factory"`` path (or a callable) may also return a PettingZoo
    ``AECEnv`` or ``ParallelEnv``: :func:`actorrl.envs.make_env` wraps it.

Parallel envs (:class:`ParallelPettingZooEnv`)
    Every live agent acts each step, as in actorrl's own protocol; the episode ends for
    everybody (``"__all__"``) when the env has no agents left, as truncated when any agent
    was truncated at the end (time limits bootstrap), else terminated.

AEC (turn-based) envs (:class:`AECPettingZooEnv`)
    Only the agent to move (``agent_selection``) is in the returned observations, so only it
    acts. Each agent's reward is what PettingZoo accumulated for it since its last move
    (``last()``), reported when it is next to move or when it is done, which is how
    actorrl credits rewards (to the agent's last action). Agents that are done are stepped
    out with ``None`` at once; their final observations and flags are returned with the
    step that ended them.

Action masks
    A PettingZoo observation ``Dict`` with ``observation`` and ``action_mask`` (the classic
    games), or an ``action_mask`` in the agent's info dict, becomes actorrl's convention:
    a ``Dict`` with ``action_mask`` and ``observations`` (:mod:`actorrl.policy.action_masking`),
    so PPO, APPO, IMPALA, A2C/A3C and DQN/Ape-X never choose an illegal move.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from actorrl.envs.protocol import ALL_AGENTS, MultiAgentEnv

INSTALL_HINT = "pip install -e '.[pettingzoo]' (or pip install pettingzoo pygame)"
PREFIX = "pettingzoo."
"""Env specs starting with this are PettingZoo module paths."""
EXPLICIT = "pettingzoo:"
"""Prefix of a non-PettingZoo module path to treat as one (``pettingzoo:mpe2.simple_v3``)."""
MASK = "action_mask"


def is_pettingzoo_spec(spec: str) -> bool:
    """Whether the env spec string names a PettingZoo module (see the module docstring)."""
    return spec.startswith(EXPLICIT) or (spec.startswith(PREFIX) and ":" not in spec)


def is_pettingzoo_env(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo ``AECEnv`` or ``ParallelEnv`` (without importing
    PettingZoo when nothing did yet)."""
    import sys
    if "pettingzoo" not in sys.modules:
        return False
    from pettingzoo import AECEnv, ParallelEnv
    return isinstance(env, (AECEnv, ParallelEnv))


def make_pettingzoo(spec: str, env_config: Mapping[str, Any] | None = None) -> MultiAgentEnv:
    """The module's ``parallel_env(**env_config)`` (or ``env(**env_config)``), wrapped."""
    module_name = spec[len(EXPLICIT):] if spec.startswith(EXPLICIT) else spec
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # the classic games import it
    try:
        importlib.import_module("pettingzoo")
    except ModuleNotFoundError:
        raise ValueError(f"env {spec!r} is a PettingZoo env and needs pettingzoo, which is not "
                         f"installed: {INSTALL_HINT}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = (f"; the classic games also need pygame: {INSTALL_HINT}"
                if exc.name == "pygame" else "")
        raise ValueError(f"env {spec!r}: cannot import {module_name!r} ({exc}){hint}") from exc
    except (AssertionError, ImportError) as exc:  # PettingZoo's renamed/removed envs
        raise ValueError(f"env {spec!r}: cannot import {module_name!r} ({exc!r}); check the "
                         f"name and version (e.g. pettingzoo.classic.tictactoe_v3)") from exc
    kwargs = dict(env_config or {})
    for name in ("parallel_env", "env"):
        factory = getattr(module, name, None)
        if callable(factory):
            return wrap_pettingzoo(factory(**kwargs))
    raise ValueError(f"env {spec!r}: module {module_name!r} has no env() or parallel_env() "
                     f"function; give a 'pkg.module:factory' path instead")


def wrap_pettingzoo(env: Any) -> MultiAgentEnv:
    """A PettingZoo ``ParallelEnv`` or ``AECEnv`` as a :class:`MultiAgentEnv`."""
    from pettingzoo import AECEnv, ParallelEnv
    if isinstance(env, ParallelEnv):
        return ParallelPettingZooEnv(env)
    if isinstance(env, AECEnv):
        return AECPettingZooEnv(env)
    raise ValueError(f"expected a PettingZoo AECEnv or ParallelEnv, got {type(env).__name__}")


class _MaskedSpaces:
    """Per-agent spaces, with PettingZoo's action masks mapped to actorrl's convention."""

    def __init__(self, agents: list[str], obs_space: Any, act_space: Any,
                 info_masks: bool) -> None:
        self.mask_in_obs: set[str] = set()
        self.mask_in_info: set[str] = set()
        self.observation_spaces: dict[str, gym.Space] = {}
        self.action_spaces: dict[str, gym.Space] = {}
        for agent in agents:
            space, actions = obs_space(agent), act_space(agent)
            self.action_spaces[agent] = actions
            if isinstance(space, gym.spaces.Dict) and MASK in space.spaces:
                rest = {k: v for k, v in space.spaces.items() if k != MASK}
                inner = rest["observation"] if set(rest) == {"observation"} \
                    else gym.spaces.Dict(rest)
                self.mask_in_obs.add(agent)
                space = gym.spaces.Dict({MASK: space.spaces[MASK], "observations": inner})
            elif info_masks and isinstance(actions, gym.spaces.Discrete):
                self.mask_in_info.add(agent)
                mask = gym.spaces.Box(0, 1, (int(actions.n),), np.int8)
                space = gym.spaces.Dict({MASK: mask, "observations": space})
            self.observation_spaces[agent] = space

    def convert(self, agent: str, obs: Any, info: Mapping[str, Any] | None) -> Any:
        """One agent's observation in actorrl's convention."""
        if agent in self.mask_in_obs:
            rest = {k: v for k, v in obs.items() if k != MASK}
            inner = rest["observation"] if set(rest) == {"observation"} else rest
            return {MASK: obs[MASK], "observations": inner}
        if agent in self.mask_in_info:
            n = int(self.action_spaces[agent].n)
            mask = (info or {}).get(MASK)
            mask = np.ones(n, np.int8) if mask is None else np.asarray(mask, np.int8)
            return {MASK: mask, "observations": obs}
        return obs


def _episode_flags(terminateds: dict[str, bool], truncateds: dict[str, bool],
                   all_done: bool) -> None:
    """Add ``"__all__"``: truncated when any agent's end was a truncation."""
    cut = any(truncateds.values())
    terminateds[ALL_AGENTS] = all_done and not cut
    truncateds[ALL_AGENTS] = all_done and cut


class ParallelPettingZooEnv(MultiAgentEnv):
    """A PettingZoo ``ParallelEnv``; see the module docstring."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)
        _, infos = env.reset()
        info_masks = any(MASK in (info or {}) for info in infos.values())
        self.spaces = _MaskedSpaces(self.possible_agents, env.observation_space,
                                    env.action_space, info_masks)
        self.observation_spaces = self.spaces.observation_spaces
        self.action_spaces = self.spaces.action_spaces

    def _convert(self, obs: Mapping[str, Any], infos: Mapping[str, Any]) -> dict[str, Any]:
        return {a: self.spaces.convert(a, o, infos.get(a)) for a, o in obs.items()}

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The env's reset, observations converted."""
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._convert(obs, infos), dict(infos)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """The env's step, observations converted and ``"__all__"`` added."""
        obs, rewards, terminateds, truncateds, infos = self.env.step(actions)
        terminateds, truncateds = dict(terminateds), dict(truncateds)
        _episode_flags(terminateds, truncateds, not self.env.agents)
        return (self._convert(obs, infos), dict(rewards), terminateds, truncateds,
                dict(infos))

    def close(self) -> None:
        """Close the env."""
        self.env.close()


class AECPettingZooEnv(MultiAgentEnv):
    """A PettingZoo ``AECEnv`` (turn-based); see the module docstring."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)
        env.reset()
        info_masks = MASK in (env.last()[4] or {})
        self.spaces = _MaskedSpaces(self.possible_agents, env.observation_space,
                                    env.action_space, info_masks)
        self.observation_spaces = self.spaces.observation_spaces
        self.action_spaces = self.spaces.action_spaces

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset; the observation of the agent to move first."""
        self.env.reset(seed=seed, options=options)
        obs, _, _, _, infos = self._collect()
        return obs, infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """The move of the agent to move; then what :meth:`_collect` gathers."""
        agent = self.env.agent_selection
        if agent not in actions:
            raise ValueError(f"it is the turn of {agent!r}, but the actions are for "
                             f"{sorted(actions)}")
        self.env.step(actions[agent])
        return self._collect()

    def _collect(self) -> tuple[dict, dict, dict, dict, dict]:
        """Observations, rewards and flags of the agents that are done (each stepped out)
        and of the next agent to move."""
        obs: dict[str, Any] = {}
        rewards: dict[str, float] = {}
        terminateds: dict[str, bool] = {}
        truncateds: dict[str, bool] = {}
        infos: dict[str, Any] = {}
        while self.env.agents:
            agent = self.env.agent_selection
            ob, reward, terminated, truncated, info = self.env.last()
            obs[agent] = self.spaces.convert(agent, ob, info)
            rewards[agent] = rewards.get(agent, 0.0) + float(reward)
            terminateds[agent], truncateds[agent] = bool(terminated), bool(truncated)
            infos[agent] = info
            if not (terminated or truncated):
                break
            self.env.step(None)
        _episode_flags(terminateds, truncateds, not self.env.agents)
        return obs, rewards, terminateds, truncateds, infos

    def close(self) -> None:
        """Close the env."""
        self.env.close()


LEARNER_VS_RANDOM: dict[str, Any] = {
    "policies": {"learner": [None, None, None, {}],
                 "random": ["actorrl.policy.random_policy:RandomPolicy", None, None, {}]},
    "policy_mapping_fn": "actorrl.envs.pettingzoo_env:learner_vs_random",
    "policies_to_train": ["learner"],
}
"""The ``multiagent`` setting of a two-player game against a fixed uniformly random
opponent (legal moves only): ``player_0`` is the trained ``learner``, every other agent
plays ``random``."""


def learner_vs_random(agent_id: str) -> str:
    """``player_0`` -> ``"learner"``, any other agent -> ``"random"`` (the first player of
    connect four, chess and go; tic-tac-toe's first player is ``player_1``)."""
    return "learner" if agent_id == "player_0" else "random"
