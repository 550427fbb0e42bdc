"""The one table of tuned values: what each algorithm's config sets over its components'
defaults.

The component dataclasses (``RolloutConfig``, the policy configs, ``ReplayConfig``,
``LearnerConfig``) and ``AlgorithmConfig`` state RLlib's defaults. The values below are
the only ones an algorithm changes, tuned so that ``actorrl train ALGO --env CartPole-v1``
solves CartPole-v1 (mean return >= 450) on a 2-core machine, as the product promises; each
algorithm's config dataclass takes its defaults from here (:func:`preset`), so a value is
stated once. They are written as a config file's nested sections (RLlib's key names).

RLlib's own tuned examples, with RLlib's stop criteria, are ``examples/*.yaml``. A file in
RLlib's layout (one that names its algorithm with RLlib's ``run:``) is written against
RLlib's defaults, so it starts from :data:`RLLIB_DEFAULTS` instead: RLlib's value of every
key tuned here, and Ape-X's own defaults over DQN's (:func:`rllib_baseline`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from actorrl.config.sections import S

CARTPOLE_TUNED: dict[str, dict[str, Any]] = {
    # Ape-X: small batches trained 8 rows per sampled env step (training_intensity), a
    # 64-unit Q-network with 3-step returns; per-worker exploration stays off (with 2
    # workers, worker 1's eps 0.4 would dominate the reported mean return).
    "apex": {
        "train_batch_size": 64,
        "training_intensity": 8.0,
        "rollout": {"num_envs_per_worker": 4, "rollout_fragment_length": 8},
        "policy": {"lr": 1e-3, "n_step": 3, "hiddens": [64],
                   "target_network_update_freq": 4000,
                   "model": {"fcnet_hiddens": [64], "fcnet_activation": "relu"}},
    },
    # DQN: RLlib's DQN defaults kept (see actorrl.algorithms.dqn); only the model, which
    # RLlib leaves to its catalog, is set (RLlib's cartpole-dqn model). With seed 0 this
    # plateaus near a mean return of 200 (25k-65k env steps): 1-step returns and lr 5e-4
    # do not reach 450 in 150k steps; examples/cartpole-dqn.yaml reaches 150 in ~18k.
    "dqn": {
        "policy": {"model": {"fcnet_hiddens": [64], "fcnet_activation": "linear"}},
    },
    # IMPALA: 8 envs per worker, RLlib's 50-step fragments, 16 of them per train batch.
    "impala": {
        "train_batch_size": 800,
        "rollout": {"num_envs_per_worker": 8, "rollout_fragment_length": 50},
        "policy": {"model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}},
    },
    # APPO: IMPALA's CartPole settings; two passes over each batch (num_sgd_iter) with the
    # old policy synced every 2 updates.
    "appo": {
        "train_batch_size": 800,
        "rollout": {"num_envs_per_worker": 8, "rollout_fragment_length": 50},
        "policy": {"model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}},
    },
    # A3C: 8 x 16-step fragments per gradient, GAE(0.95), a tight gradient clip.
    "a3c": {
        "rollout": {"num_envs_per_worker": 8, "rollout_fragment_length": 16},
        "policy": {"lr": 3e-3, "grad_clip": 0.5, "lambda": 0.95,
                   "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}},
    },
    # A2C: A3C's sections (A2CConfig extends A3C's ActorCriticConfig), and gradients of
    # 256-step microbatches accumulated to 512 rows.
    "a2c": {"train_batch_size": 512, "microbatch_size": 256},
    # PPO: 2 workers x 8 envs, "auto" fragments (128 steps) to 2048-row train batches,
    # 10 epochs of 256-row minibatches at lr 1e-3, GAE(0.95), a 64x64 tanh net with a
    # separate value branch. vf_clip_param is lifted from RLlib's 10 (CartPole's returns
    # reach ~100, so a clamped squared error would stop the value branch learning).
    # Reaches 450 in 57k-86k env steps over seeds 0-4 (about 10-25 s on 2 shared cores).
    "ppo": {
        "train_batch_size": 2048,
        "rollout": {"num_envs_per_worker": 8},
        "policy": {"lr": 1e-3, "lambda": 0.95, "vf_clip_param": 10000.0,
                   "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}},
        "learner": {"num_sgd_iter": 10, "sgd_minibatch_size": 256},
    },
}
"""Algorithm name -> its settings over the components' defaults (nested sections)."""


_RLLIB_MODEL = {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"}
"""RLlib's default fully connected net (its ``MODEL_DEFAULTS``)."""

_RLLIB_Q_MODEL = {**_RLLIB_MODEL, "vision_net": "rllib"}
"""RLlib's model defaults for DQN and Ape-X, images through RLlib's own vision net (raw
0-255 pixels, xavier-uniform init): RLlib's DQN Breakout release test reached 19.25 at 400k
env steps with it, 5.07 with actorrl's scaled pixels (benchmarks/dqn_input_scale.py)."""

RLLIB_DEFAULTS: dict[str, dict[str, Any]] = {
    # RLlib's APEX: DQN's defaults with Ape-X's own over them (n-step 3, 512-row batches of
    # 50-step fragments, a 2M-row buffer sharded 4 ways, learning from 50k steps, a target
    # update every 500k, per-worker epsilons, 25k-step iterations of at least 30 s, worker-
    # side priorities). training_intensity: none, as the seeds' (RLlib 1.x) Ape-X.
    "apex": {
        "train_batch_size": 512,
        "training_intensity": None,
        "timesteps_per_iteration": 25000,
        "min_iter_time_s": 30,
        "rollout": {"num_envs_per_worker": 1, "rollout_fragment_length": 50},
        "policy": {"lr": 5e-4, "n_step": 3, "hiddens": [256],
                   "target_network_update_freq": 500000,
                   "exploration_config": {"type": "PerWorkerEpsilonGreedy"},
                   "model": _RLLIB_Q_MODEL},
        "replay": {"buffer_size": 2000000, "learning_starts": 50000,
                   "num_replay_buffer_shards": 4, "worker_side_prioritization": True},
    },
    "dqn": {"policy": {"model": _RLLIB_Q_MODEL}},
    # RLlib's IMPALA (and APPO, which extends it): 500-row batches of 50-step fragments,
    # one env per worker.
    "impala": {
        "train_batch_size": 500,
        "rollout": {"num_envs_per_worker": 1, "rollout_fragment_length": 50},
        "policy": {"model": _RLLIB_MODEL},
    },
    "appo": {
        "train_batch_size": 500,
        "rollout": {"num_envs_per_worker": 1, "rollout_fragment_length": 50},
        "policy": {"model": _RLLIB_MODEL},
    },
    # RLlib's A3C: 10-step fragments, lr 1e-4, grad_clip 40, GAE(1.0).
    "a3c": {
        "rollout": {"num_envs_per_worker": 1, "rollout_fragment_length": 10},
        "policy": {"lr": 1e-4, "grad_clip": 40.0, "lambda": 1.0, "model": _RLLIB_MODEL},
    },
    # RLlib's A2C: A3C's values with 20-step fragments, the common 200-row train batch and
    # no microbatches.
    "a2c": {
        "train_batch_size": 200,
        "microbatch_size": None,
        "rollout": {"num_envs_per_worker": 1, "rollout_fragment_length": 20},
        "policy": {"lr": 1e-4, "grad_clip": 40.0, "lambda": 1.0, "model": _RLLIB_MODEL},
    },
    # RLlib's PPO: 4000-row batches, 30 epochs of 128-row minibatches, lr 5e-5, GAE(1.0),
    # value loss clipped at 10.
    "ppo": {
        "train_batch_size": 4000,
        "rollout": {"num_envs_per_worker": 1},
        "policy": {"lr": 5e-5, "lambda": 1.0, "vf_clip_param": 10.0, "model": _RLLIB_MODEL},
        "learner": {"num_sgd_iter": 30, "sgd_minibatch_size": 128},
    },
}
"""Algorithm name -> RLlib's values of the keys :data:`CARTPOLE_TUNED` sets (and, for
Ape-X, of the keys where RLlib's Ape-X defaults differ from its DQN's), as nested sections:
where a file in RLlib's layout starts (see :func:`rllib_baseline`)."""


def rllib_baseline(algorithm: str) -> dict[str, Any]:
    """Where a config file in RLlib's layout starts for ``algorithm``: RLlib's defaults
    for what actorrl tunes (a deep copy of :data:`RLLIB_DEFAULTS`; empty for algorithms
    whose defaults are all RLlib's already)."""
    return copy.deepcopy(RLLIB_DEFAULTS.get(algorithm, {}))


def preset(algorithm: str, section: str, cls: type[S]) -> Callable[[], S]:
    """The default factory of ``algorithm``'s ``section``: ``cls`` (a component config)
    with that section's tuned values, if any, over its own defaults."""
    values: Mapping[str, Any] = CARTPOLE_TUNED[algorithm].get(section, {})
    return lambda: cls.load(values, path=f"{section}.")


def tuned(algorithm: str, key: str) -> Any:
    """``algorithm``'s tuned top-level value of ``key`` (a dataclass field default)."""
    return CARTPOLE_TUNED[algorithm][key]

