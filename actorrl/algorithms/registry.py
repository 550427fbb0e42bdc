"""The algorithms by name: what ``actorrl train NAME`` and ``run: NAME`` look up."""

from __future__ import annotations

import difflib

from actorrl.algorithms.trainer import AlgorithmSpec


def _registry() -> dict[str, AlgorithmSpec]:
    from actorrl.algorithms.a2c import A2C
    from actorrl.algorithms.a3c import A3C
    from actorrl.algorithms.apex import APEX
    from actorrl.algorithms.apex_ddpg import APEX_DDPG
    from actorrl.algorithms.appo import APPO
    from actorrl.algorithms.ddpg import DDPG, TD3
    from actorrl.algorithms.dqn import DQN
    from actorrl.algorithms.impala import IMPALA
    from actorrl.algorithms.ppo import PPO
    from actorrl.algorithms.sac import SAC

    specs = (APEX, DQN, A3C, IMPALA, A2C, APPO, PPO, SAC, DDPG, TD3, APEX_DDPG)
    return {spec.name: spec for spec in specs}


def algorithm_names() -> list[str]:
    """Names accepted by :func:`get_algorithm`."""
    return sorted(_registry())


def get_algorithm(name: str) -> AlgorithmSpec:
    """The spec of algorithm ``name``; a clear error with suggestions otherwise."""
    registry = _registry()
    spec = registry.get(name.lower())
    if spec is None:
        from actorrl.config.aliases import RLLIB_ONLY_ALGORITHMS

        if name.lower() in {n.lower() for n in RLLIB_ONLY_ALGORITHMS}:
            raise ValueError(f"algorithm {name!r} is RLlib's, and actorrl does not have it; "
                             f"actorrl has {', '.join(algorithm_names())}: use one of those "
                             "(with a config file written for it)")
        close = difflib.get_close_matches(name.lower(), list(registry), n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown algorithm {name!r}; choose one of "
                         f"{', '.join(algorithm_names())}.{hint}")
    return spec

