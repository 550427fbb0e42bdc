"""``actorrl.load_policy``: a trained policy for plain Python, one observation at a time.

::

    import gymnasium as gym
    import actorrl

    policy = actorrl.load_policy("results/ppo_CartPole-v1_2026-01-01_12-00-00")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        action = policy.compute_action(obs)          # greedy; explore=True samples
        obs, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated

No cluster, no actor process: the policy is built in the calling process exactly as
training built it (the checkpoint's algorithm, config and weights, see
:func:`~actorrl.experiment.evaluate.load_checkpoint_policy`), and each raw env observation
goes through what the rollout workers did to it (structured spaces flattened, the
checkpoint's ``MeanStdFilter`` applied without updating it). A recurrent policy takes its
state in and gives the next one out::

    state = None                                     # None: the episode's start state
    action, state = policy.compute_action(obs, state, prev_reward=reward)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from actorrl.experiment.evaluate import LoadedPolicy, action_options, load_checkpoint_policy


class Policy:
    """A checkpoint's policy in this process (see the module docstring); made by
    :func:`load_policy`."""

    def __init__(self, loaded: LoadedPolicy) -> None:
        self._loaded = loaded
        self._policy = loaded.policy
        self._observe: Callable[[list[Any]], np.ndarray] = (
            loaded.observe or (lambda raw: np.stack([np.asarray(o) for o in raw])))

    @property
    def algorithm(self) -> str:
        """The algorithm that trained it (``ppo``, ``apex``...)."""
        return self._loaded.algorithm

    @property
    def env(self) -> str:
        """The env id (or factory path) it was trained on."""
        return self._loaded.env

    @property
    def checkpoint(self) -> str:
        """The checkpoint folder it was loaded from."""
        return self._loaded.checkpoint

    @property
    def config(self) -> dict[str, Any]:
        """The run's resolved config (RLlib key names, as in ``config.json``)."""
        return self._loaded.config

    @property
    def observation_space(self) -> Any:
        """The env's observation space (what :meth:`compute_action` takes)."""
        return self._policy.observation_space

    @property
    def action_space(self) -> Any:
        """The env's action space (what :meth:`compute_action` returns)."""
        return self._policy.action_space

    @property
    def is_recurrent(self) -> bool:
        """Whether :meth:`compute_action` takes and returns a state."""
        return bool(getattr(self._policy, "is_recurrent", False))

    @property
    def torch_policy(self) -> Any:
        """The underlying :class:`~actorrl.policy.base.TorchPolicy` (its ``model`` is the
        ``torch.nn.Module`` that :mod:`actorrl.experiment.export` exports)."""
        return self._policy

    def get_initial_state(self) -> list[np.ndarray]:
        """A recurrent policy's state at an episode's start (one array per state tensor);
        ``[]`` for a feed-forward policy."""
        return [np.array(s, copy=True) for s in self._policy.get_initial_state()]

    def preprocess(self, obs: Any) -> np.ndarray:
        """One raw env observation as the model's input row (flattened when structured,
        the checkpoint's observation filter applied), without a batch dimension."""
        return self._observe([obs])[0]

    def compute_action(self, obs: Any, state: Sequence[np.ndarray] | None = None,
                       explore: bool = False, *, prev_action: Any = None,
                       prev_reward: float | None = None) -> Any:
        """The action for one raw env observation: greedy unless ``explore`` (then sampled
        as in training: the action distribution, or DQN's epsilon at the policy's step).

        A feed-forward policy returns the action as the env takes it (an ``int`` for
        ``Discrete`` spaces; a ``Box`` action mapped onto the space's bounds or clipped as
        the checkpoint's ``normalize_actions`` / ``clip_actions`` say). A recurrent policy
        returns ``(action, state)``: pass ``state`` None at an episode's start, and the
        returned state with the next observation; when its model reads the previous action
        or reward (``lstm_use_prev_action`` / ``lstm_use_prev_reward``) pass
        ``prev_action`` (the action this method returned) / ``prev_reward`` from the second
        step on (at the start they are zeros, as in training)."""
        batch = self._observe([obs])
        if not self.is_recurrent:
            if state:
                raise ValueError("this policy is not recurrent: call compute_action(obs) "
                                 "without a state")
            actions, _ = self._policy.compute_actions(batch, explore=explore)
            return self._single(actions[0])
        start = state is None
        state = self.get_initial_state() if start else list(state)
        inputs = self._policy.recurrent_inputs
        prev_action = self._previous(inputs.prev_actions, prev_action, start, "prev_action",
                                     "lstm_use_prev_action", self.zero_action)
        if prev_action is not None and not start and self.action_options["normalize"]:
            from actorrl.data.actions import squash_action

            prev_action = squash_action(np.asarray(prev_action), self.action_space)
        prev_reward = self._previous(inputs.prev_rewards, prev_reward, start, "prev_reward",
                                     "lstm_use_prev_reward", lambda: 0.0)
        actions, extras = self._policy.compute_actions(
            batch, explore=explore, state=[np.asarray(s)[None] for s in state],
            prev_actions=None if prev_action is None else np.asarray(prev_action)[None],
            prev_rewards=None if prev_reward is None
            else np.array([prev_reward], np.float32))
        new_state = [extras[f"state_out_{i}"][0] for i in range(len(state))]
        return self._single(actions[0]), new_state

    def _previous(self, wanted: bool, value: Any, start: bool, name: str, option: str,
                  zero: Callable[[], Any]) -> Any:
        if not wanted:
            return None
        if value is None:
            if not start:
                raise ValueError(f"model option '{option}' is set: pass {name}= (the "
                                 "previous step's) with every state but the start state")
            return zero()
        return value

    def zero_action(self) -> np.ndarray:
        """A recurrent model's previous-action input at an episode's start (zeros of the
        action space's shape)."""
        space = self.action_space
        return np.zeros(space.shape, np.int64 if space.shape == () else np.float32)

    @property
    def action_options(self) -> dict[str, bool]:
        """``normalize`` / ``clip``: how the checkpoint's workers turned the policy's
        actions into the env's (``normalize_actions`` / ``clip_actions``)."""
        return action_options(self.config)

    def _single(self, action: np.ndarray) -> Any:
        from actorrl.data.actions import env_actions

        return env_actions(self.action_space, np.asarray(action)[None],
                           **self.action_options)[0]


def load_policy(path: str | os.PathLike[str], *, env: str | None = None) -> Policy:
    """The policy of the checkpoint at ``path`` (a checkpoint folder, or a results folder:
    its latest checkpoint) as a :class:`Policy` for plain Python: ``compute_action(obs,
    state=None, explore=False)``. ``env`` overrides the checkpoint's env id (the env is
    built once, for its spaces). Checkpoints of older formats are migrated on reading.
    Single-agent checkpoints only; a missing or unreadable checkpoint raises
    :class:`~actorrl.experiment.errors.UsageError` naming it."""
    return Policy(load_checkpoint_policy(path, env=env))
