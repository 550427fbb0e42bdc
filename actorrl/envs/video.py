"""Episode videos: envs rendered as ``rgb_array`` frames and recorded by gymnasium's
:class:`~gymnasium.wrappers.RecordVideo`, one mp4 per episode.

Used by ``actorrl evaluate --video DIR`` and by the evaluation workers of a training run
with ``record_env`` (RLlib's key; ``monitor`` is its older spelling). RecordVideo writes
the mp4 with moviepy, which the ``video`` extra installs (:data:`VIDEO_INSTALL_HINT`).
An episode's file is written when the next episode starts or the env is closed.

Multi-agent envs (:class:`~actorrl.envs.protocol.MultiAgentEnv`) have no ``render`` in
actorrl's protocol and are refused with :func:`check_recordable`'s message.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from actorrl.envs.protocol import MultiAgentEnv

VIDEO_INSTALL_HINT = "pip install -e '.[video]' (or pip install 'actorrl[video]')"
"""How to install what recording needs (moviepy, and pygame for classic-control envs)."""

RENDER_MODE = "rgb_array"


def check_video_support() -> None:
    """``ValueError`` naming the ``video`` extra when moviepy, which RecordVideo writes mp4s
    with, cannot be imported."""
    try:
        importlib.import_module("moviepy")
    except ImportError:
        raise ValueError("recording episode videos needs moviepy (gymnasium's RecordVideo "
                         f"writes mp4s with it), which is not installed: {VIDEO_INSTALL_HINT}"
                         ) from None


def rgb_array_config(env_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env_config`` with ``render_mode: rgb_array`` (what ``gymnasium.make`` and env
    factories that honour it need to draw frames), replacing any other render mode.

    Also sets ``SDL_VIDEODRIVER=dummy`` in this process unless it is set: pygame (which
    classic-control envs draw with) then makes its offscreen frames without looking for a
    display, which a headless machine lacks (SDL complains about ``XDG_RUNTIME_DIR``)."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    return {**dict(env_config or {}), "render_mode": RENDER_MODE}


def check_recordable(env: Any, spec: Any) -> None:
    """``ValueError`` saying why ``env`` (made from ``spec`` with :func:`rgb_array_config`)
    cannot be recorded and what to do: a multi-agent env, or one that does not render
    ``rgb_array`` frames."""
    if isinstance(env, MultiAgentEnv):
        raise ValueError(
            f"env {spec!r} is multi-agent: actorrl's MultiAgentEnv protocol has no render(), "
            "so its episodes cannot be recorded; record a single-agent version of the env, "
            "or evaluate without --video / record_env")
    mode = getattr(env, "render_mode", None)
    if mode != RENDER_MODE:
        raise ValueError(
            f"env {spec!r} does not render {RENDER_MODE} frames (its render_mode is "
            f"{mode!r} although env_config asked for render_mode={RENDER_MODE!r}): videos "
            f"need an env whose constructor or factory takes render_mode and whose render() "
            f"returns an image; make the env honour env_config['render_mode'], or evaluate "
            f"without --video / record_env")


def record_episodes(env: Any, folder: str, name_prefix: str, spec: Any = None) -> gym.Env:
    """``env`` wrapped to write every episode to ``<folder>/<name_prefix>-episode-<k>.mp4``
    (``k`` counts this env's episodes from 0). ``ValueError`` when the env cannot be
    recorded (:func:`check_recordable`) or moviepy is missing (:func:`check_video_support`).
    """
    check_video_support()
    check_recordable(env, spec if spec is not None else env)
    return gym.wrappers.RecordVideo(env, folder, episode_trigger=_every_episode,
                                    name_prefix=name_prefix, disable_logger=True)


def _every_episode(episode: int) -> bool:
    return True
