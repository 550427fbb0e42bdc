"""Environments: creation from a spec, vectorization inside a worker, episode metrics.

Env specs
    A gymnasium id (``"CartPole-v1"``), a ``"pkg.module:factory"`` path, or a callable.
    A factory is called with an :class:`EnvContext` (the ``env_config`` dict plus
    ``worker_index``, ``vector_index``, ``num_workers``); a gymnasium id gets ``env_config``
    as keyword arguments of ``gymnasium.make``. gymnasium's own ``"module:EnvId"`` form also
    works (the module is imported, then the id made). A PettingZoo module path
    (``"pettingzoo.classic.connect_four_v3"``) makes that env as a :class:`MultiAgentEnv`
    (:mod:`actorrl.envs.pettingzoo_env`; a factory may also return a PettingZoo env).
    actorrl ships ``actorrl/StatelessCartPole-v1`` (:mod:`actorrl.envs.custom.partial`), a
    partially observed CartPole for recurrent policies, and ``actorrl/MemoryCue-v0``
    (:mod:`actorrl.envs.custom.memory`), a cue to recall a few steps later.

Vectorization
    :class:`VectorEnv` holds ``num_envs`` single-agent envs and steps them one after the
    other in the calling thread. An env whose episode ends (``terminated`` or ``truncated``)
    is reset at once by hand (gymnasium's vector autoreset is not used), so every step
    returns both the final observation of the finished episode (for bootstrapping) and the
    first observation of the next one (to act on). :class:`MultiAgentVectorEnv` does the
    same for :class:`MultiAgentEnv`. Env ``i`` of worker ``w`` is seeded once, at its first
    reset, with ``seed + 1000 * w + i``.

Multi-agent protocol (:class:`MultiAgentEnv`)
    ``reset(seed=None, options=None) -> (obs, infos)`` and
    ``step(actions) -> (obs, rewards, terminateds, truncateds, infos)``, every value a dict
    keyed by agent id. An agent acts in a step exactly when it is a key of the last
    returned ``obs``. ``terminateds`` and ``truncateds`` also carry ``"__all__"``, which
    ends the episode for everybody. An agent whose own flag is set is done for the rest of
    the episode. Rewards are credited to the agent's last action and summed until the agent
    next observes (turn-based games work); rewards before an agent's first action are
    counted in the episode total only. When an agent is done or the episode ends, the
    env should include the agent's final observation in ``obs``; if it does not, the
    agent's last observation stands in. ``possible_agents``, ``observation_spaces`` and
    ``action_spaces`` describe the agents (used to infer policy spaces).

Episode metrics
    Envs record every finished episode's total reward and length in an
    :class:`EpisodeMetrics` (raw lists, so several workers' metrics merge exactly);
    :class:`EpisodeWindow` turns a stream of them into RLlib's smoothed result keys.

Modules
    :mod:`actorrl.envs.make` (env specs to envs), :mod:`actorrl.envs.protocol` (the
    multi-agent protocol), :mod:`actorrl.envs.pettingzoo_env` (PettingZoo envs),
    :mod:`actorrl.envs.vector` (the vectorized envs a worker steps),
    :mod:`actorrl.envs.episodes` (episode metrics), :mod:`actorrl.envs.custom.pixel` (a small
    pixel game, ``--env actorrl.envs.custom.pixel:catch``). The names below are re-exported here.
"""

from __future__ import annotations

from actorrl.envs.episodes import EpisodeMetrics, EpisodeWindow
from actorrl.envs.make import (
    ALL_AGENTS,
    MINATAR_HINT,
    EnvContext,
    EnvSpec,
    MultiAgentEnv,
    make_env,
    register_minatar,
)
from actorrl.envs.vector import (
    SEED_STRIDE_PER_WORKER,
    MultiAgentStep,
    MultiAgentVectorEnv,
    VectorEnv,
    VectorStep,
    make_vector_env,
)

__all__ = [
    "ALL_AGENTS", "MINATAR_HINT", "SEED_STRIDE_PER_WORKER", "EnvContext", "EnvSpec",
    "EpisodeMetrics", "EpisodeWindow", "MultiAgentEnv", "MultiAgentStep",
    "MultiAgentVectorEnv", "VectorEnv", "VectorStep", "make_env", "make_vector_env",
    "register_minatar",
]
