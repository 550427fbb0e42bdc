"""Atari games with DeepMind preprocessing, built from an id (``ALE/Pong-v5``,
``PongNoFrameskip-v4``), as RLlib's ``preprocessor_pref="deepmind"`` does.

The wrappers, outermost last (each one switchable through ``env_config``, see
:class:`AtariOptions`):

1. ``noop_max``: up to 30 random no-ops after every real reset;
2. ``frame_skip``: each action repeated 4 frames, the observation the max of the last two
   (the Atari screen flickers), rewards summed;
3. ``episodic_life``: a lost life ends the episode for learning, but the game goes on
   (the next ``reset`` is a no-op step); episode metrics are recorded on real game ends;
4. ``fire_reset``: FIRE (and the move after it) on reset in games that wait for it;
5. ``frame_size``/``grayscale``: 84x84 single-channel frames (``cv2.INTER_AREA``; with
   ``grayscale=False`` three RGB channels);
6. ``clip_rewards``: learning sees ``sign(reward)`` while the reported episode returns stay
   game scores;
7. ``frame_stack``: the last 4 frames stacked on the channel axis, HWC ``(84, 84, 4)``
   uint8 (``channels_first=True`` gives CHW ``(4, 84, 84)``).

Reported returns: the wrappers put the unclipped reward in ``info["game_reward"]`` and the
real end of a game in ``info["game_over"]``; :class:`actorrl.envs.VectorEnv` reads both.

RLlib's model keys for these wrappers (``model.dim``, ``model.grayscale``,
``model.framestack``; RLlib passes them to its ``wrap_deepmind``) are folded into
``env_config`` by :func:`model_env_config` when an algorithm config is built, so
``model: {dim: 42}`` is ``env_config: {frame_size: 42}``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

GAME_REWARD = "game_reward"
"""``info`` key: the step's unclipped reward (what the game scored)."""
GAME_OVER = "game_over"
"""``info`` key: True when the game really ended (not just a life)."""

_ATARI_ID = re.compile(r"^(ALE/[A-Za-z]+-v5|[A-Z][A-Za-z]+(NoFrameskip|Deterministic)?-v[04])$")
_DETERMINISTIC_ID = re.compile(r"^([A-Z][A-Za-z]+)Deterministic-(v[04])$")
DETERMINISTIC_FRAMESKIP = 4
"""Frames the ALE itself repeated each action in gym's ``*Deterministic-v0/v4`` ids."""
INSTALL_HINT = "pip install -e '.[atari]' (or pip install ale-py opencv-python-headless)"


@dataclass(frozen=True, kw_only=True)
class AtariOptions:
    """DeepMind preprocessing settings, read from ``env_config`` (unknown keys refused)."""

    preprocessing: str = "deepmind"
    """``"deepmind"``: the wrappers below; ``"none"``: the raw ALE env."""
    noop_max: int = 30
    """Most random no-ops after a reset (0: none)."""
    frame_skip: int = 4
    """Frames each action is repeated (max-pooled over the last two); 1: none."""
    episodic_life: bool = True
    """A lost life ends the learning episode (metrics still count whole games)."""
    fire_reset: bool = True
    """Press FIRE after a reset in games whose action set has it (Breakout, ...)."""
    frame_size: int = 84
    """Side of the square resized frame (0: keep 210x160)."""
    grayscale: bool = True
    """One luminance channel instead of RGB."""
    clip_rewards: bool = True
    """Learn from ``sign(reward)``; reported returns stay game scores."""
    frame_stack: int = 4
    """Frames stacked on the channel axis (1: none)."""
    channels_first: bool = False
    """Observations CHW ``(stack, H, W)`` instead of HWC ``(H, W, stack)``."""
    repeat_action_probability: float | None = None
    """Sticky actions; None keeps the id's default (0.25 for v5, 0 for v4)."""
    full_action_space: bool = False
    """All 18 actions instead of the game's minimal set."""
    render_mode: str | None = None
    """The ALE's ``render_mode`` (``rgb_array``: ``render()`` returns the full-colour
    210x160 screen, as episode videos record it; observations are unchanged)."""

    @classmethod
    def from_env_config(cls, env_config: dict[str, Any] | None) -> AtariOptions:
        """Options from ``env_config``; unknown keys raise ``ValueError`` with suggestions."""
        names = [f.name for f in dataclasses.fields(cls)]
        values = dict(env_config or {})
        for key in values:
            if key == "frameskip":  # not frame_skip: another setting (actorrl.config.aliases)
                raise ValueError(
                    "env_config.frameskip is RLlib's (the ALE's own skip, beneath the "
                    "DeepMind wrapper's); actorrl's ALE env skips no frames and "
                    "env_config.frame_skip (default 4) is the wrapper's max-pooled skip: "
                    "drop frameskip (RLlib's frameskip: 1 is actorrl's default), or set "
                    "frame_skip: N for N frames per action")
            if key not in names:
                close = difflib.get_close_matches(key, names, n=2)
                hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
                raise ValueError(f"unknown Atari env_config key {key!r}{hint} "
                                 f"(known: {', '.join(names)})")
        options = cls(**values)
        if options.preprocessing not in ("deepmind", "none"):
            raise ValueError(f"env_config.preprocessing must be 'deepmind' or 'none', got "
                             f"{options.preprocessing!r}")
        for key in ("noop_max", "frame_size"):
            if getattr(options, key) < 0:
                raise ValueError(f"env_config.{key} must be >= 0, got {getattr(options, key)}")
        for key in ("frame_skip", "frame_stack"):
            if getattr(options, key) < 1:
                raise ValueError(f"env_config.{key} must be >= 1, got {getattr(options, key)}")
        return options


def module_qualified_id(spec: str) -> str | None:
    """The env id in gymnasium's ``module:EnvId`` form (``ale_py:ALE/Pong-v5``): ``EnvId``
    once ``module`` is imported (which registers it, as ``gymnasium.make`` does), or None
    when ``spec`` is not that form (no colon, a module that does not import, or a
    ``pkg.module:factory`` path naming an attribute of the module)."""
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    if hasattr(module, name) or name not in gym.envs.registry:
        return None
    return name


def is_atari_id(spec: Any) -> bool:
    """Whether ``spec`` names an ALE game (``ALE/Pong-v5``, ``PongNoFrameskip-v4``,
    ``PongDeterministic-v4``, gymnasium's ``ale_py:ALE/Pong-v5``...)."""
    if isinstance(spec, str) and ":" in spec:
        spec = module_qualified_id(spec)
    return isinstance(spec, str) and bool(_ATARI_ID.match(spec)) and (
        spec.startswith("ALE/") or _registered_by_ale(_registered_form(spec)[0]))


def _registered_form(env_id: str) -> tuple[str, int]:
    """The id ale-py registers for ``env_id`` and the frames its ALE skips per action.

    gym's ``*Deterministic-v0/v4`` ids (RLlib's older Atari files use them) are no longer
    registered by ale-py: they were the ``*NoFrameskip`` game with the ALE repeating each
    action 4 frames, the same sticky-action setting, and no max-pooling (RLlib's DeepMind
    wrappers pool only ``NoFrameskip`` ids). Every other id skips no frames in the ALE.
    """
    match = _DETERMINISTIC_ID.match(env_id)
    if match and (gym.envs.registry.get(env_id) is None):
        return f"{match[1]}NoFrameskip-{match[2]}", DETERMINISTIC_FRAMESKIP
    return env_id, 1


def _registered_by_ale(env_id: str) -> bool:
    register_ale()
    entry = gym.envs.registry.get(env_id)
    return entry is not None and "ale_py" in str(entry.entry_point)


def register_ale() -> bool:
    """Register ale-py's envs with gymnasium; False when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def make_atari(env_id: str, env_config: dict[str, Any] | None = None) -> gym.Env:
    """The ALE game ``env_id`` with DeepMind preprocessing as ``env_config`` asks."""
    options = AtariOptions.from_env_config(env_config)
    if not register_ale():
        raise ValueError(f"env {env_id!r} needs ale-py, which is not installed: "
                         f"{INSTALL_HINT}")
    asked, (env_id, ale_frameskip) = env_id, _registered_form(env_id)
    if ale_frameskip > 1 and options.preprocessing != "none":
        if env_config and "frame_skip" in env_config:
            raise ValueError(
                f"env {asked!r} repeats each action {ale_frameskip} frames in the ALE, "
                f"so env_config.frame_skip (the DeepMind wrapper's max-pooled skip) would "
                f"skip again: drop frame_skip, or use {env_id!r} with frame_skip: N")
        options = dataclasses.replace(options, frame_skip=1)
    if env_id not in gym.envs.registry:
        names = [n for n in gym.envs.registry if n.startswith("ALE/")]
        close = difflib.get_close_matches(env_id, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown Atari game {env_id!r}{hint}")
    kwargs: dict[str, Any] = {"full_action_space": options.full_action_space}
    if options.render_mode is not None:
        kwargs["render_mode"] = options.render_mode
    if options.repeat_action_probability is not None:
        kwargs["repeat_action_probability"] = options.repeat_action_probability
    if options.preprocessing == "none":
        return gym.make(env_id, **kwargs, **(
            {"frameskip": ale_frameskip} if ale_frameskip > 1 else {}))
    # Frame skipping with max-pooling is done by the wrapper, except for the ids whose
    # ALE skipped (see _registered_form).
    kwargs["frameskip"] = ale_frameskip
    kwargs["obs_type"] = "grayscale" if options.grayscale else "rgb"
    env: gym.Env = gym.make(env_id, **kwargs)
    return wrap_deepmind(env, options)


MODEL_ENV_KEYS = {"dim": "frame_size", "grayscale": "grayscale", "framestack": "frame_stack"}
"""RLlib ``model`` keys that set DeepMind preprocessing -> the ``env_config`` key each sets."""
RLLIB_DIM = 84
"""RLlib's ``model.dim`` default (a no-op on envs that are not Atari ids, as in RLlib)."""


def model_env_config(env: Any, env_config: dict[str, Any] | None,
                     model: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """``env_config`` with the RLlib ``model`` keys of :data:`MODEL_ENV_KEYS` folded in, and
    the problems that prevent it (then ``env_config`` comes back unchanged).

    On an Atari id (:func:`is_atari_id`): ``dim`` sets ``frame_size``, ``grayscale`` sets
    ``grayscale``, ``framestack: false`` sets ``frame_stack: 1`` (``true`` keeps the stack
    of 4, or the ``frame_stack`` given). A key is written only where it changes the
    effective value, so a config is folded once and folding again changes nothing. A
    ``model`` key that contradicts the same setting given in ``env_config`` is a problem
    naming both. Elsewhere ``grayscale`` and ``framestack`` do nothing (as in RLlib, whose
    preprocessors read them for Atari frames only), and ``dim`` other than 84 is refused:
    it would resize nothing. Without any of these keys nothing is checked (no ale-py
    import): the default path costs nothing.
    """
    env_config = dict(env_config or {})
    given = {key: value for key, value in (model or {}).items() if key in MODEL_ENV_KEYS}
    if not given:
        return env_config, []
    problems: list[str] = []
    if not is_atari_id(env):
        dim = given.get("dim", RLLIB_DIM)
        if dim != RLLIB_DIM:
            problems.append(
                f"model.dim={dim!r} resizes the frames of Atari ids (DeepMind preprocessing), "
                f"but env {env!r} is not one: drop model.dim, or resize the observations in "
                f"your own env (e.g. gymnasium.wrappers.ResizeObservation in a "
                f"'pkg.module:factory' env)")
        return env_config, problems
    defaults = AtariOptions()
    wanted: dict[str, Any] = {}
    if "dim" in given:
        wanted["frame_size"] = given["dim"]
    if "grayscale" in given:
        wanted["grayscale"] = given["grayscale"]
    if "framestack" in given and not given["framestack"]:
        wanted["frame_stack"] = 1
    for key, value in wanted.items():
        model_key = next(k for k, v in MODEL_ENV_KEYS.items() if v == key)
        if key in env_config and env_config[key] != value:
            problems.append(
                f"model.{model_key}={given[model_key]!r} (which sets env_config.{key}="
                f"{value!r}) and env_config.{key}={env_config[key]!r} disagree: set only one "
                f"of them, or make them agree")
    if given.get("framestack") is True and env_config.get("frame_stack") == 1:
        problems.append("model.framestack=True and env_config.frame_stack=1 disagree: set "
                        "model.framestack to false, or env_config.frame_stack above 1")
    changes = {key: value for key, value in wanted.items()
               if env_config.get(key, getattr(defaults, key)) != value}
    if changes and env_config.get("preprocessing", defaults.preprocessing) == "none":
        problems.append(f"model.{', model.'.join(sorted(given))} set DeepMind preprocessing, "
                        f"but env_config.preprocessing is 'none' (the raw ALE env): drop "
                        f"those model keys or env_config.preprocessing")
    if problems:
        return env_config, problems
    return {**env_config, **changes}, []


def wrap_deepmind(env: gym.Env, options: AtariOptions) -> gym.Env:
    """Apply the DeepMind wrappers that ``options`` switch on, in the order of the module
    docstring, to an ALE env that skips no frames itself."""
    if options.noop_max > 0:
        env = NoopReset(env, options.noop_max)
    if options.frame_skip > 1:
        env = MaxAndSkip(env, options.frame_skip)
    env = EpisodicLife(env, enabled=options.episodic_life)
    if options.fire_reset and "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    if options.frame_size > 0 or options.grayscale:
        env = WarpFrame(env, options.frame_size, grayscale=options.grayscale)
    env = ClipReward(env, enabled=options.clip_rewards)
    if options.frame_stack > 1 or options.channels_first:
        env = FrameStack(env, options.frame_stack, channels_first=options.channels_first)
    return env


class NoopReset(gym.Wrapper):
    """Up to ``noop_max`` random NOOPs after each real reset (varied start states)."""

    def __init__(self, env: gym.Env, noop_max: int) -> None:
        super().__init__(env)
        self.noop_max = noop_max
        meanings = env.unwrapped.get_action_meanings()
        if meanings[0] != "NOOP":
            raise ValueError(f"noop reset needs action 0 to be NOOP, got {meanings[0]!r}")

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeat each action ``skip`` frames; observe the max of the last two, sum rewards.

    On an ale-py env that skips no frames itself, the frames before the last one are
    stepped on the emulator directly (``ale.act``), reading the screen only for the
    second-to-last frame, and the last frame goes through ``env.step`` as usual: the
    same frames, rewards, ends and info as stepping ``env`` ``skip`` times, without the
    Python wrapper calls and screen copies of the skipped frames (about a tenth of a Pong
    step's CPU at 42x42; emulation is most of the rest).
    """

    def __init__(self, env: gym.Env, skip: int) -> None:
        super().__init__(env)
        self.skip = skip
        self._frames = np.zeros((2, *env.observation_space.shape),
                                dtype=env.observation_space.dtype)
        self._ale, self._actions, self._read_screen = _direct_ale(env) or (None, [], None)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._ale is not None:
            return self._step_on_ale(action)
        total = 0.0
        terminated = truncated = False
        info: dict = {}
        for i in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i >= self.skip - 2:
                self._frames[i - (self.skip - 2)] = obs
            total += float(reward)
            if terminated or truncated:
                if i < self.skip - 2:  # ended before the pooled frames: use this one
                    self._frames[:] = obs
                elif i == self.skip - 2:
                    self._frames[1] = obs
                break
        return self._frames.max(axis=0), total, terminated, truncated, info

    def _step_on_ale(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        ale = self._ale
        ale_action = self._actions[int(action)]
        total = 0.0
        for i in range(self.skip - 1):
            total += ale.act(ale_action)
            if ale.game_over():  # ended before the last frame: observe this one
                self._read_screen(self._frames[0])
                info = {"lives": ale.lives(),
                        "episode_frame_number": ale.getEpisodeFrameNumber(),
                        "frame_number": ale.getFrameNumber()}
                return (self._frames[0].copy(), total, ale.game_over(with_truncation=False),
                        ale.game_truncated(), info)
            if i == self.skip - 2:
                self._read_screen(self._frames[0])
        obs, reward, terminated, truncated, info = self.env.step(action)
        total += float(reward)
        return np.maximum(self._frames[0], obs), total, terminated, truncated, info


def _direct_ale(env: gym.Env) -> tuple[Any, list[Any], Any] | None:
    """``(ale, action set, read_screen(into))`` when ``env`` is ale-py's AtariEnv
    stepping one frame per action with discrete actions and screen observations (what
    :func:`make_atari` builds for the max-pooling wrapper); None for anything else."""
    try:
        from ale_py.env import AtariEnv
    except ImportError:
        return None
    base = env.unwrapped
    if (not isinstance(base, AtariEnv) or getattr(base, "_frameskip", None) != 1
            or getattr(base, "continuous", True) or getattr(base, "sound_obs", True)
            or not isinstance(env.action_space, gym.spaces.Discrete)):
        return None
    ale = base.ale
    shape = env.observation_space.shape
    if shape == tuple(ale.getScreenDims()):
        read_screen = ale.getScreenGrayscale
    elif shape == (*ale.getScreenDims(), 3):
        read_screen = ale.getScreenRGB
    else:
        return None
    for actions in (ale.getMinimalActionSet(), ale.getLegalActionSet()):
        if list(actions) == list(getattr(base, "_action_set", ())):
            return ale, list(actions), read_screen
    return None


class EpisodicLife(gym.Wrapper):
    """A lost life terminates the learning episode; ``reset`` then only steps a NOOP
    unless the game is really over. Sets ``info["game_over"]`` on every step."""

    def __init__(self, env: gym.Env, enabled: bool = True) -> None:
        super().__init__(env)
        self.enabled = enabled
        self._lives = 0
        self._game_over = True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if self.enabled and 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        info = {**info, GAME_OVER: self._game_over}
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        if self._game_over or not self.enabled:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game after all
                obs, info = self.env.reset(**kwargs)
        self._lives = self.env.unwrapped.ale.lives()
        self._game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE, then action 2, after a reset (games that wait for FIRE to start)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ValueError(f"fire reset needs action 1 to be FIRE, got {meanings[:3]}")

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                self.env.reset(**kwargs)
        return obs, info


class WarpFrame(gym.ObservationWrapper):
    """Resize to ``size`` x ``size`` (area interpolation; 0: keep the size), grayscale if
    not already (``grayscale=False`` keeps RGB frames RGB); the output keeps a channel
    axis: ``(H, W, C)`` uint8."""

    def __init__(self, env: gym.Env, size: int, grayscale: bool = True) -> None:
        super().__init__(env)
        import cv2

        self._cv2 = cv2
        shape = env.observation_space.shape
        rgb = len(shape) == 3 and shape[-1] == 3
        self._rgb = rgb and grayscale
        self.size = size
        height, width = (size, size) if size > 0 else shape[:2]
        channels = 3 if rgb and not grayscale else 1
        self.observation_space = gym.spaces.Box(0, 255, (height, width, channels), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        frame = observation
        if self._rgb:
            frame = self._cv2.cvtColor(frame, self._cv2.COLOR_RGB2GRAY)
        if self.size > 0:
            frame = self._cv2.resize(frame, (self.size, self.size),
                                     interpolation=self._cv2.INTER_AREA)
        return frame[:, :, None] if frame.ndim == 2 else frame


class ClipReward(gym.Wrapper):
    """``sign(reward)`` for learning; ``info["game_reward"]`` keeps the game's reward."""

    def __init__(self, env: gym.Env, enabled: bool = True) -> None:
        super().__init__(env)
        self.enabled = enabled

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = {**info, GAME_REWARD: float(reward)}
        return obs, (float(np.sign(reward)) if self.enabled else reward), terminated, \
            truncated, info


class FrameStack(gym.Wrapper):
    """The last ``k`` frames on the channel axis (HWC, or CHW with ``channels_first``);
    after a reset the first frame fills the stack. RGB frames (``grayscale=False``) stack
    their channels frame after frame: ``(H, W, 3k)``."""

    def __init__(self, env: gym.Env, k: int, channels_first: bool = False) -> None:
        super().__init__(env)
        self.k = k
        self.channels_first = channels_first
        height, width, channels = env.observation_space.shape
        self._channels = channels
        self._frames: deque[np.ndarray] = deque(maxlen=k)
        depth = k * channels
        shape = (depth, height, width) if channels_first else (height, width, depth)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)

    def _observation(self) -> np.ndarray:
        axis = 0 if self.channels_first else -1
        if self.channels_first and self._channels != 1:
            return np.concatenate([np.moveaxis(f, -1, 0) for f in self._frames], axis=0)
        return np.concatenate([f.reshape(1, *f.shape[:2]) if self.channels_first else f
                               for f in self._frames], axis=axis)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.k):
            self._frames.append(obs)
        return self._observation(), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._frames.append(obs)
        return self._observation(), reward, terminated, truncated, info
