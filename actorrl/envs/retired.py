"""Env ids that RLlib's files name and gymnasium no longer builds, run as their current
versions.

* gym's MuJoCo ``-v2``/``-v3`` ids (``HalfCheetah-v2``, ``Hopper-v3``, ``Humanoid-v2``...)
  needed ``mujoco-py``; gymnasium still registers them but refuses to build them. They run
  as gymnasium's ``-v5`` envs (the ``mujoco`` bindings), the same robots and rewards with
  the fixes of v4/v5.
* Classic-control and toy-text ``-v0`` ids that gymnasium retired (``Pendulum-v0``,
  ``FrozenLake-v0``...) run as the ``-v1`` that replaced them.

Each mapping is announced with one warning line per process, naming both ids. MuJoCo ids
need the ``mujoco`` extra: without it they fail naming the extra.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import warnings

MUJOCO_ROBOTS = ("HalfCheetah", "Hopper", "Walker2d", "Humanoid", "HumanoidStandup", "Ant",
                 "Swimmer", "Reacher", "Pusher", "InvertedPendulum",
                 "InvertedDoublePendulum")
"""gymnasium's MuJoCo envs."""

MUJOCO_INSTALL_HINT = 'pip install -e ".[mujoco]" (or: pip install "actorrl[mujoco]")'
"""How to get gymnasium's MuJoCo envs."""

RETIRED_CLASSIC_IDS: dict[str, str] = {
    "Pendulum-v0": "Pendulum-v1",
    "FrozenLake-v0": "FrozenLake-v1",
    "FrozenLake8x8-v0": "FrozenLake8x8-v1",
    "BipedalWalker-v2": "BipedalWalker-v3",
    "BipedalWalkerHardcore-v2": "BipedalWalkerHardcore-v3",
    "LunarLander-v2": "LunarLander-v3",
    "LunarLanderContinuous-v2": "LunarLanderContinuous-v3",
    "CarRacing-v0": "CarRacing-v3",
}
"""Retired gym ids -> the gymnasium ids that replaced them."""

_MUJOCO_ID = re.compile(rf"^({'|'.join(MUJOCO_ROBOTS)})-v(\d+)$")
_MUJOCO_CURRENT = "v5"


class RetiredEnvIdWarning(UserWarning):
    """An env id was replaced by its current version (one line per id and process)."""


def is_mujoco_id(env_id: object) -> bool:
    """Whether ``env_id`` names one of gymnasium's MuJoCo envs (any version)."""
    return isinstance(env_id, str) and bool(_MUJOCO_ID.match(env_id))


def current_env_id(env_id: str) -> str:
    """The id gymnasium builds for ``env_id``: retired MuJoCo ``-v0..-v3`` ids -> ``-v5``,
    retired classic ids -> their replacements, anything else unchanged. Warns once per
    mapped id (:class:`RetiredEnvIdWarning`)."""
    match = _MUJOCO_ID.match(env_id)
    if match and int(match[2]) < 4:
        current = f"{match[1]}-{_MUJOCO_CURRENT}"
    else:
        current = RETIRED_CLASSIC_IDS.get(env_id, env_id)
    if current != env_id:
        _announce(env_id, current)
    return current


def check_mujoco_installed(env_id: str) -> None:
    """``ValueError`` naming the extra when ``env_id`` is a MuJoCo env and the ``mujoco``
    package is missing."""
    if is_mujoco_id(env_id) and importlib.util.find_spec("mujoco") is None:
        raise ValueError(f"env {env_id!r} is a MuJoCo env and needs the mujoco extra, which "
                         f"is not installed: {MUJOCO_INSTALL_HINT}")


@functools.cache
def _announce(old: str, new: str) -> None:
    warnings.warn(f"env {old!r} is retired (gymnasium no longer builds it); running "
                  f"{new!r} instead", RetiredEnvIdWarning, stacklevel=3)
