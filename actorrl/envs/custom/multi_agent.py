"""Multi-agent envs shipped for trying (and testing) multi-agent training.

``actorrl.envs.custom.multi_agent:two_cartpoles`` makes :class:`TwoCartPoles`: two independent
CartPole-v1 games, one per agent (``agent_0``, ``agent_1``), stepped together. An agent
whose pole falls (or whose game reaches 500 steps) is done for the rest of the episode;
the episode ends when both are. ``policy_for_agent`` maps ``agent_i`` to ``policy_i``::

    actorrl train apex --env actorrl.envs.custom.multi_agent:two_cartpoles --set multiagent='{
        "policies": {"policy_0": [null, null, null, {}], "policy_1": [null, null, null, {}]},
        "policy_mapping_fn": "actorrl.envs.custom.multi_agent:policy_for_agent"}'

:class:`MultiAgentCartPole` is RLlib's example env of that name (its tuned
``multi-agent-cartpole-*`` files name ``ray.rllib.examples.env.multi_agent.MultiAgentCartPole``,
which actorrl reads as this class): ``env_config["num_agents"]`` (default 1; RLlib's files
write ``env_config: {config: {num_agents: 4}}``, read alike) independent
games whose agent ids are the integers ``0..n-1``, and :func:`policy_p_agent_id`, RLlib's
example mapping ``agent_id -> "p<agent_id>"``.

Each policy's return is in the results as ``policy_reward_mean`` (RLlib's key); an episode's
``episode_reward_mean`` is the sum over all agents.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from actorrl.envs import ALL_AGENTS, EnvContext, MultiAgentEnv
from actorrl.envs.custom.rllib_examples import constructor_config

AGENTS = ("agent_0", "agent_1")

TWO_CARTPOLES_MULTIAGENT: dict[str, Any] = {
    "policies": {"policy_0": [None, None, None, {}], "policy_1": [None, None, None, {}]},
    "policy_mapping_fn": "actorrl.envs.custom.multi_agent:policy_for_agent",
}
"""The ``multiagent`` setting that trains one policy per agent of :class:`TwoCartPoles`."""


def policy_for_agent(agent_id: str) -> str:
    """``agent_i`` -> ``policy_i``."""
    return agent_id.replace("agent_", "policy_", 1)


class IndependentCartPoles(MultiAgentEnv):
    """One CartPole-v1 game per agent id, stepped together; see the module docstring."""

    def __init__(self, agents: list[Any]) -> None:
        self.games = {agent: gym.make("CartPole-v1") for agent in agents}
        self.possible_agents = list(agents)
        self.observation_spaces = {a: g.observation_space for a, g in self.games.items()}
        self.action_spaces = {a: g.action_space for a, g in self.games.items()}
        self.done: set[Any] = set()

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[Any, Any], dict[Any, Any]]:
        """Every game starts; agent i's game is seeded with ``seed + i``."""
        self.done = set()
        obs = {}
        for i, (agent, game) in enumerate(self.games.items()):
            obs[agent], _ = game.reset(seed=None if seed is None else seed + i)
        return obs, {}

    def step(self, actions: dict[Any, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step the games of the agents that acted; a finished game's agent is done."""
        obs, rewards, terminateds, truncateds = {}, {}, {}, {}
        for agent, action in actions.items():
            ob, reward, terminated, truncated, _ = self.games[agent].step(action)
            obs[agent], rewards[agent] = ob, float(reward)
            terminateds[agent], truncateds[agent] = bool(terminated), bool(truncated)
            if terminated or truncated:
                self.done.add(agent)
        # The last game's ending says how the episode ended (a time limit bootstraps).
        everyone_done = len(self.done) == len(self.games)
        cut = any(truncateds.values())
        terminateds[ALL_AGENTS] = everyone_done and not cut
        truncateds[ALL_AGENTS] = everyone_done and cut
        return obs, rewards, terminateds, truncateds, {}

    def close(self) -> None:
        """Close every game."""
        for game in self.games.values():
            game.close()


class TwoCartPoles(IndependentCartPoles):
    """Two independent CartPole-v1 games, agents ``agent_0`` and ``agent_1``."""

    def __init__(self, env_config: EnvContext | dict | None = None) -> None:
        super().__init__(list(AGENTS))


class MultiAgentCartPole(IndependentCartPoles):
    """RLlib's ``MultiAgentCartPole``: ``env_config["num_agents"]`` (default 1) games, agents
    ``0..n-1`` (integers, as RLlib numbers them)."""

    def __init__(self, env_config: EnvContext | dict | None = None) -> None:
        num_agents = constructor_config(env_config).get("num_agents", 1)
        if not isinstance(num_agents, int) or isinstance(num_agents, bool) or num_agents < 1:
            raise ValueError(f"env_config.num_agents must be an integer >= 1, got "
                             f"{num_agents!r}")
        super().__init__(list(range(num_agents)))


def policy_p_agent_id(agent_id: Any) -> str:
    """RLlib's example ``PolicyMappingFn``: agent ``i`` -> policy ``"p<i>"``."""
    return f"p{agent_id}"


def two_cartpoles(ctx: EnvContext) -> TwoCartPoles:
    """The env factory (``"actorrl.envs.custom.multi_agent:two_cartpoles"``)."""
    return TwoCartPoles(ctx)
