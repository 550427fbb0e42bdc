"""From a policy's actions to an env's actions (RLlib's ``normalize_actions`` and
``clip_actions``).

With ``normalize_actions`` (RLlib's default) a policy acts in a normalised space: for a
float ``Box`` bounded on every side, its actions are meant to lie in [-1, 1] and are mapped
linearly onto ``[low, high]`` (-1 -> low, +1 -> high), then clipped to the bounds, so that
a sample from an unbounded distribution is still a valid action; an integer ``Box`` is
shifted by ``low``. Spaces that are not bounded ``Box`` es pass unchanged. With
``clip_actions`` instead, float ``Box`` actions are clipped to ``[low, high]``.

Either way only the env sees the transformed action: the sample batch keeps the action the
policy sampled, so the loss's log-probability is that of the action that was sampled, not
of its clipped or rescaled image (a clipped action's density under the policy is not the
density of the sample that produced it).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def is_bounded_box(space: gym.Space) -> bool:
    """Whether ``space`` is a ``Box`` with finite bounds on every side (what
    ``normalize_actions`` rescales)."""
    return (isinstance(space, gym.spaces.Box) and bool(np.all(space.bounded_below))
            and bool(np.all(space.bounded_above)))


def unsquash_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """``action`` from the normalised space to ``space``'s: a float bounded ``Box``:
    ``low + (action + 1) * (high - low) / 2``, clipped to ``[low, high]``; an integer
    bounded ``Box``: ``low + action``; anything else unchanged."""
    if not is_bounded_box(space):
        return action
    if np.issubdtype(space.dtype, np.integer):
        return (space.low + action).astype(space.dtype)
    low = space.low.astype(np.float64)
    high = space.high.astype(np.float64)
    scaled = low + (np.asarray(action, dtype=np.float64) + 1.0) * (high - low) / 2.0
    return np.clip(scaled, low, high).astype(space.dtype)


def squash_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """The inverse of :func:`unsquash_action` on ``[low, high]``: an env action (a float
    bounded ``Box``) mapped into [-1, 1]; an integer bounded ``Box``: ``action - low``.
    What a policy acting in the normalised space would have to output for ``action``
    (used for offline or demonstration actions given in env units)."""
    if not is_bounded_box(space):
        return action
    if np.issubdtype(space.dtype, np.integer):
        return np.asarray(action) - space.low
    low = space.low.astype(np.float64)
    high = space.high.astype(np.float64)
    normalised = 2.0 * (np.asarray(action, dtype=np.float64) - low) / (high - low) - 1.0
    return np.clip(normalised, -1.0, 1.0).astype(np.float32)


def clip_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """A float ``Box`` action clipped to ``[low, high]``; anything else unchanged."""
    if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.integer):
        return np.clip(action, space.low, space.high)
    return action


def env_actions(space: gym.Space, actions: np.ndarray, *, normalize: bool, clip: bool
                ) -> Any:
    """A batch of a policy's ``actions`` as the env takes them: Python ints for
    ``Discrete``; ``Box`` rows unsquashed (``normalize``) or clipped (``clip``)."""
    if isinstance(space, gym.spaces.Discrete):
        return actions.tolist()
    if normalize:
        return unsquash_action(actions, space)
    if clip:
        return clip_action(actions, space)
    return actions
