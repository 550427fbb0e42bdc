"""``actorrl evaluate``: roll out a checkpoint's greedy policy in this process.

The policy is built exactly as training built it (a :class:`RolloutWorker` with the
checkpoint's algorithm and config, worker index 0), loaded with the checkpoint's weights,
and run with ``explore=False`` on up to :data:`MAX_PARALLEL_ENVS` envs in lockstep, one
batched forward pass per step. Episode ``k`` is seeded with ``seed + k`` when a seed is
given, so evaluations repeat exactly.

With ``video`` (``--video DIR``) every episode is recorded by gymnasium's ``RecordVideo``
(the envs render ``rgb_array``; :mod:`actorrl.envs.video`) and written as
``DIR/episode-<k>.mp4``, ``k`` as above; needs the ``video`` extra.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from actorrl.algorithms import get_algorithm
from actorrl.algorithms.checkpoints import CheckpointError, read_checkpoint
from actorrl.data.batch import DEFAULT_POLICY_ID
from actorrl.envs.video import check_video_support, record_episodes, rgb_array_config
from actorrl.experiment.errors import UsageError, error_summary
from actorrl.experiment.evaluate_multiagent import (
    is_multi_agent,
    policy_means,
    rollout_multi_agent,
)

MAX_PARALLEL_ENVS = 16
RENDER_MODES = ("no", "human")


@dataclass(frozen=True)
class EvaluationResult:
    """Returns of the evaluated episodes and their statistics (RLlib-style names)."""

    checkpoint: str
    algorithm: str
    env: str
    episodes: int
    episode_reward_mean: float
    episode_reward_std: float
    episode_reward_min: float
    episode_reward_max: float
    episode_len_mean: float
    episode_rewards: list[float]
    policy_reward_mean: dict[str, float] = field(default_factory=dict)
    """Multi-agent: each policy's mean return (see :mod:`.evaluate_multiagent`)."""
    policy_rewards: dict[str, list[float]] = field(default_factory=dict)
    """Multi-agent: each policy's return in every episode it played."""
    videos: list[str] = field(default_factory=list)
    """With ``video``: the episodes' mp4 files, in the order of ``episode_rewards`` (the
    order the episodes ended); ``episode-<k>.mp4`` is the episode seeded ``seed + k``."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def describe(self) -> str:
        """One human line: ``mean ± std`` over the episodes, min, max, mean length."""
        return (f"{self.algorithm} checkpoint {self.checkpoint} on {self.env}: "
                f"{self.episodes} episodes, return mean {self.episode_reward_mean:.2f} "
                f"std {self.episode_reward_std:.2f} (min {self.episode_reward_min:.1f}, "
                f"max {self.episode_reward_max:.1f}), episode_len_mean "
                f"{self.episode_len_mean:.1f}"
                + "".join(f"; policy {pid} mean {mean:.3f}"
                          for pid, mean in self.policy_reward_mean.items())
                + (f"; {len(self.videos)} videos in {Path(self.videos[0]).parent}"
                   if self.videos else ""))


def action_options(config: dict[str, Any]) -> dict[str, bool]:
    """``normalize`` / ``clip`` of :func:`actorrl.data.actions.env_actions` as the
    checkpoint's workers used them. A checkpoint from before ``normalize_actions`` existed
    has none in its config: its policy acted in the env's units, clipped."""
    rollout = dict(config.get("rollout") or {})
    return {"normalize": bool(rollout.get("normalize_actions",
                                          config.get("normalize_actions", False))),
            "clip": bool(rollout.get("clip_actions", config.get("clip_actions", True)))}


def evaluate_checkpoint(path: str | os.PathLike[str], episodes: int, *,
                        env: str | None = None, seed: int | None = None,
                        render: str = "no", video: str | os.PathLike[str] | None = None
                        ) -> EvaluationResult:
    """Load the checkpoint at ``path`` (a checkpoint folder or a results folder: its latest
    checkpoint) and run ``episodes`` greedy episodes; ``env`` overrides the checkpoint's.
    A multi-agent checkpoint plays all its policies (:mod:`.evaluate_multiagent`).
    ``video``: a folder where episode ``k`` is recorded as ``episode-<k>.mp4`` (single-agent
    envs that render ``rgb_array``; the ``video`` extra)."""
    if episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {episodes}")
    if render not in RENDER_MODES:
        raise UsageError(f"--render must be one of {', '.join(RENDER_MODES)}, got {render!r}")
    if video is not None:
        _check_video_options(render)
    folder, state, spec = _read_checkpoint(path)
    config = dict(state.get("config") or {})
    env_id = env or str(config.get("env"))
    env_config = dict(config.get("env_config") or {})
    if render == "human":
        env_config["render_mode"] = "human"
    per_policy: dict[str, list[float]] = {}
    videos: list[str] = []
    if is_multi_agent(config):
        if video is not None:
            raise UsageError(
                f"--video records single-agent envs, and checkpoint {str(folder)!r} is "
                "multi-agent (multiagent.policies): actorrl's MultiAgentEnv protocol has no "
                "render(), so RecordVideo cannot draw its episodes; evaluate without --video")
        returns, lengths, per_policy = rollout_multi_agent(
            spec.policy, env_id, env_config, config, state, episodes,
            min(episodes, MAX_PARALLEL_ENVS), seed)
    else:
        count = min(episodes, MAX_PARALLEL_ENVS)
        finished: list[tuple[int, int, int]] = []
        recording = _VideoRecording(Path(video)) if video is not None else None
        envs = _make_envs(env_id, rgb_array_config(env_config) if recording else env_config,
                          count)
        try:
            if recording is not None:
                envs = recording.wrap(envs, env_id)
            policy = _load_policy(spec.policy, env_id, dict(config.get("env_config") or {})
                                  if recording else env_config, config, state)
            observe = observation_fn(envs[0].observation_space, config, state)
            returns, lengths = _rollout(policy, envs, episodes, seed, observe,
                                        action_options(config), finished)
        finally:
            for e in envs:
                e.close()
            if recording is not None:
                videos = recording.finish(finished)
    arr = np.asarray(returns, dtype=np.float64)
    return EvaluationResult(
        checkpoint=str(folder), algorithm=spec.name, env=env_id, episodes=len(returns),
        episode_reward_mean=float(arr.mean()), episode_reward_std=float(arr.std()),
        episode_reward_min=float(arr.min()), episode_reward_max=float(arr.max()),
        episode_len_mean=float(np.mean(lengths)), episode_rewards=[float(r) for r in returns],
        policy_reward_mean=policy_means(per_policy), policy_rewards=per_policy,
        videos=videos)


def _check_video_options(render: str) -> None:
    """``--video`` needs rgb_array frames (not ``--render human``) and moviepy."""
    if render != "no":
        raise UsageError(f"--video and --render {render} cannot be combined: a video needs "
                         "the env to render rgb_array frames; drop --render")
    try:
        check_video_support()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class _VideoRecording:
    """Evaluation episodes recorded into ``folder``: env ``i`` writes its episodes to a
    temporary sub-folder, and :meth:`finish` moves each to ``episode-<k>.mp4`` by the
    episode number ``k`` the rollout gave it (seeded ``seed + k``)."""

    def __init__(self, folder: Path) -> None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--video {str(folder)!r}: cannot create the folder: "
                             f"{error_summary(exc)}") from None
        self.folder = folder
        self.scratch = Path(tempfile.mkdtemp(prefix=".recording-", dir=folder))

    def wrap(self, envs: list[Any], env_id: str) -> list[Any]:
        """``envs`` wrapped in RecordVideo (UsageError when one cannot be recorded)."""
        try:
            return [record_episodes(e, str(self.scratch / f"env{i}"), "rl-video", env_id)
                    for i, e in enumerate(envs)]
        except ValueError as exc:
            raise UsageError(f"--video: {exc}") from None

    def finish(self, finished: list[tuple[int, int, int]]) -> list[str]:
        """Move the written videos into place (after the envs closed). ``finished``: per
        finished episode, in the order they ended, ``(env index, that env's episode
        index, episode number)`` (see :func:`_rollout`); the videos' paths in that order,
        the order of the result's ``episode_rewards``."""
        paths = []
        try:
            for i, local, k in finished:
                written = self.scratch / f"env{i}" / f"rl-video-episode-{local}.mp4"
                if written.is_file():
                    target = self.folder / f"episode-{k}.mp4"
                    os.replace(written, target)
                    paths.append(str(target))
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return paths


def _read_checkpoint(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any], Any]:
    """The checkpoint's folder, state and algorithm spec; UsageError when the user named
    something that is no checkpoint of a known algorithm."""
    try:
        folder, state = read_checkpoint(path)
    except CheckpointError as exc:  # the user named it: bad input
        raise UsageError(str(exc)) from None
    try:
        spec = get_algorithm(str(state["algorithm"]))
    except ValueError as exc:
        raise UsageError(f"checkpoint {str(folder)!r}: {exc}") from None
    return folder, state, spec


def _make_envs(env_id: str, env_config: dict[str, Any], count: int) -> list[Any]:
    from actorrl.envs import MultiAgentEnv, make_env

    envs: list[Any] = []
    try:
        for _ in range(count):
            envs.append(make_env(env_id, env_config))
    except ValueError as exc:
        for e in envs:
            e.close()
        raise UsageError(str(exc)) from None
    except Exception as exc:
        for e in envs:
            e.close()
        raise UsageError(f"cannot create env {env_id!r}: {error_summary(exc)}") from None
    if isinstance(envs[0], MultiAgentEnv):
        for e in envs:
            e.close()
        raise UsageError(f"env {env_id!r} is multi-agent; evaluate rolls out single-agent "
                         "envs only")
    return envs


def _load_policy(policy_class: str, env_id: str, env_config: dict[str, Any],
                 config: dict[str, Any], state: dict[str, Any]) -> Any:
    from actorrl.rollout import RolloutWorker

    worker_config = {**config, "env_config": env_config, "num_envs_per_worker": 1,
                     "explore": False}
    worker = RolloutWorker(env_id, policy_class, worker_config, worker_index=0,
                           num_workers=0)
    worker.stop()  # only its policy is needed; the envs above do the rollouts
    policies = state["policies"]
    if DEFAULT_POLICY_ID not in policies:
        raise UsageError(f"checkpoint holds policies {sorted(policies)}, not "
                         f"{DEFAULT_POLICY_ID!r}; evaluate supports single-agent checkpoints")
    try:
        worker.set_weights({DEFAULT_POLICY_ID: policies[DEFAULT_POLICY_ID]["weights"]})
    except (RuntimeError, KeyError) as exc:
        raise UsageError(f"the checkpoint's weights do not fit a policy for {env_id!r}: "
                         f"{error_summary(exc)}") from None
    return worker.get_policy(DEFAULT_POLICY_ID)


def observation_fn(space: Any, config: dict[str, Any], state: dict[str, Any]
                   ) -> Callable[[list[Any]], np.ndarray]:
    """What turns envs' raw observations into the policy's batch, as on the training
    workers: structured observations flattened (actorrl.data.spaces), then the checkpoint's
    observation filter applied without updating it (RLlib's ``update=False``)."""
    from actorrl.data.spaces import observation_preprocessor
    from actorrl.envs.filters import MeanStdFilter, filter_shape, make_filter

    prep = observation_preprocessor(space)
    name = (config.get("rollout") or {}).get("observation_filter",
                                             config.get("observation_filter", "NoFilter"))
    obs_filter = make_filter(name, filter_shape(space)) if name != "NoFilter" else None
    saved = (state.get("filters") or {}).get(DEFAULT_POLICY_ID)
    if isinstance(obs_filter, MeanStdFilter) and saved is not None:
        obs_filter.set_state(saved)

    def observe(raw: list[Any]) -> np.ndarray:
        batch = np.stack([prep(o) for o in raw] if prep is not None else raw)
        return obs_filter(batch, update=False) if obs_filter is not None else batch

    return observe


def _single_env_action(space: Any, action: np.ndarray, options: dict[str, bool]) -> Any:
    from actorrl.data.actions import env_actions

    return env_actions(space, action[None], **options)[0]


def _rollout(policy: Any, envs: list[Any], episodes: int, seed: int | None,
             observe: Callable[[list[Any]], np.ndarray], action_opts: dict[str, bool],
             finished: list[tuple[int, int, int]] | None = None
             ) -> tuple[list[float], list[int]]:
    """Run ``episodes`` episodes on ``envs`` in lockstep; returns (returns, lengths), in
    the order the episodes ended. A recurrent policy's state (and previous action and
    reward) is carried per env and reset at each episode's start. ``finished`` (when
    given) gets, per ended episode in that order, ``(env index, that env's episode index,
    episode number k)``: episode ``k`` is the ``k``-th started, seeded ``seed + k``."""
    n = len(envs)
    initial = policy.get_initial_state() if getattr(policy, "is_recurrent", False) else None
    state: list[list[np.ndarray]] = [[] for _ in range(n)]
    prev_action: list[Any] = [None] * n
    prev_reward = [0.0] * n
    obs: list[Any] = [None] * n
    episode_return = [0.0] * n
    episode_len = [0] * n
    active = [False] * n
    number = [0] * n
    local = [-1] * n
    started = 0
    returns: list[float] = []
    lengths: list[int] = []

    def start(i: int) -> None:
        nonlocal started
        number[i] = started
        local[i] += 1
        obs[i] = envs[i].reset(seed=None if seed is None else seed + started)[0]
        episode_return[i], episode_len[i], active[i] = 0.0, 0, True
        if initial is not None:
            state[i] = [np.array(s, copy=True) for s in initial]
            prev_action[i] = np.zeros(action_space.shape,
                                      np.int64 if action_space.shape == () else np.float32)
            prev_reward[i] = 0.0
        started += 1

    action_space = envs[0].action_space

    for i in range(n):
        start(i)
    while any(active):
        rows = [i for i in range(n) if active[i]]
        batch_obs = observe([obs[i] for i in rows])
        if initial is None:
            actions, _ = policy.compute_actions(batch_obs, explore=False)
        else:
            actions, extras = policy.compute_actions(
                batch_obs, explore=False,
                state=[np.stack([state[i][k] for i in rows]) for k in range(len(initial))],
                prev_actions=np.stack([prev_action[i] for i in rows]),
                prev_rewards=np.array([prev_reward[i] for i in rows], np.float32))
            for j, i in enumerate(rows):
                state[i] = [extras[f"state_out_{k}"][j] for k in range(len(initial))]
                prev_action[i] = actions[j]
        for i, action in zip(rows, actions):
            obs[i], reward, terminated, truncated, _ = envs[i].step(
                _single_env_action(action_space, action, action_opts))
            episode_return[i] += float(reward)
            prev_reward[i] = float(reward)
            episode_len[i] += 1
            if terminated or truncated:
                returns.append(episode_return[i])
                lengths.append(episode_len[i])
                if finished is not None:
                    finished.append((i, local[i], number[i]))
                if started < episodes:
                    start(i)
                else:
                    active[i] = False
    return returns, lengths


@dataclass(frozen=True)
class LoadedPolicy:
    """A checkpoint's policy, ready to compute actions, with what it was trained on."""

    policy: Any
    checkpoint: str
    timesteps_total: int | None
    algorithm: str
    env: str
    env_config: dict[str, Any]
    config: dict[str, Any]
    observe: Callable[[list[Any]], np.ndarray] | None = None
    """Raw env observations -> the policy's input batch (flattening structured spaces,
    the checkpoint's observation filter); see :func:`observation_fn`."""


def load_checkpoint_policy(path: str | os.PathLike[str], *, env: str | None = None
                           ) -> LoadedPolicy:
    """Load the single-agent policy of the checkpoint at ``path`` (a checkpoint folder or a
    results folder: its latest checkpoint), greedy (``explore`` off), for analysis scripts
    that roll it out themselves; ``env`` overrides the checkpoint's env id."""
    folder, state, spec = _read_checkpoint(path)
    config = dict(state.get("config") or {})
    env_id = env or str(config.get("env"))
    env_config = dict(config.get("env_config") or {})
    policy = _load_policy(spec.policy, env_id, env_config, config, state)
    observe = observation_fn(policy.observation_space, config, state)
    return LoadedPolicy(policy, str(folder), state.get("timesteps_total"), spec.name, env_id,
                        env_config, config, observe)
