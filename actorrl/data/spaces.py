"""Observation preprocessing for structured spaces (RLlib's preprocessors).

``Box`` and ``Discrete`` observations reach the policy as the env returns them (images stay
uint8; the model one-hot encodes ``Discrete``). Every other space (``Dict``, ``Tuple``,
``MultiDiscrete``, ``MultiBinary``, nested) is flattened on the rollout worker into one
float32 vector, as RLlib's ``DictFlatteningPreprocessor`` / ``TupleFlatteningPreprocessor``
do: the leaves in the space's order (a ``Dict``'s keys sorted, as gymnasium keeps them),
``Box`` leaves flattened, ``Discrete`` leaves one-hot, ``MultiDiscrete`` leaves one one-hot
per component. Sample batches, replay and the wire carry only that vector; the policy
keeps the original space, and the default models cut the vector back into its leaves
(:func:`flat_leaves`), sending rank-3 ``Box`` leaves (images) through the conv encoder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple


def needs_flattening(space: gym.Space) -> bool:
    """Whether observations of ``space`` are flattened before the policy sees them."""
    return not isinstance(space, (Box, Discrete))


def check_observation_space(space: gym.Space, where: str = "observation space") -> None:
    """``ValueError`` naming the leaf when ``space`` holds a leaf that cannot be
    flattened (``Text``, ``Graph``, ``Sequence``...)."""
    if isinstance(space, Dict):
        for key, sub in space.spaces.items():
            check_observation_space(sub, f"{where}[{key!r}]")
    elif isinstance(space, Tuple):
        for i, sub in enumerate(space.spaces):
            check_observation_space(sub, f"{where}[{i}]")
    elif not isinstance(space, (Box, Discrete, MultiDiscrete, MultiBinary)):
        raise ValueError(f"{where} is {space!r}: supported observation spaces are Box, "
                         f"Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them "
                         f"(or set model.custom_model and flatten it in the env)")


def observation_preprocessor(space: gym.Space) -> Callable[[Any], np.ndarray] | None:
    """The per-observation flattening for ``space`` (None when it needs none)."""
    if not needs_flattening(space):
        return None
    check_observation_space(space)

    def flatten(obs: Any) -> np.ndarray:
        return np.asarray(gym.spaces.flatten(space, obs), dtype=np.float32)

    return flatten


def flat_size(space: gym.Space) -> int:
    """Length of the flattened observation vector."""
    return int(gym.spaces.flatdim(space))


@dataclass(frozen=True)
class FlatLeaf:
    """One leaf of a structured space inside the flat vector: ``vector[start:start+size]``."""

    path: str
    space: gym.Space
    start: int
    size: int

    @property
    def is_image(self) -> bool:
        """Whether the leaf is a rank-3 ``Box`` (goes through the conv encoder)."""
        return isinstance(self.space, Box) and len(self.space.shape) == 3


def flat_leaves(space: gym.Space, path: str = "obs", start: int = 0) -> list[FlatLeaf]:
    """The leaves of ``space`` in the order :func:`gymnasium.spaces.flatten` lays them out."""
    if isinstance(space, Dict):
        out: list[FlatLeaf] = []
        for key, sub in space.spaces.items():
            out += flat_leaves(sub, f"{path}[{key!r}]", start + sum(leaf.size for leaf in out))
        return out
    if isinstance(space, Tuple):
        out = []
        for i, sub in enumerate(space.spaces):
            out += flat_leaves(sub, f"{path}[{i}]", start + sum(leaf.size for leaf in out))
        return out
    size = int(math.prod(space.shape)) if isinstance(space, Box) else flat_size(space)
    return [FlatLeaf(path, space, start, size)]
