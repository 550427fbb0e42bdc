"""The multi-agent env protocol (:class:`MultiAgentEnv`, described in :mod:`actorrl.envs`),
apart from env creation so that env adapters (:mod:`actorrl.envs.pettingzoo_env`) can
implement it; :mod:`actorrl.envs.make` re-exports both names."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

ALL_AGENTS = "__all__"
"""The key of the whole-episode flags in ``terminateds`` and ``truncateds``."""


class MultiAgentEnv:
    """Base class of multi-agent envs; see the module docstring for the protocol.

    Subclasses set ``possible_agents`` (agent ids), ``observation_spaces`` and
    ``action_spaces`` (agent id -> space) and implement :meth:`reset` and :meth:`step`.
    """

    possible_agents: list[str] = []
    observation_spaces: dict[str, gym.Space] = {}
    action_spaces: dict[str, gym.Space] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: observations of the agents that act first, and infos."""
        raise NotImplementedError

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Apply one action per acting agent: ``(obs, rewards, terminateds, truncateds,
        infos)`` keyed by agent id; the flag dicts also hold ``"__all__"``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (nothing by default)."""
