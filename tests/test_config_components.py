"""Every key of every algorithm's config reaches the component that uses it, unchanged.

Each algorithm's config is built from RLlib flat keys with a non-default value for every
key it has (a new key without a value here fails the coverage check). Then the dataclasses
each component receives (worker: rollout + policy; learner; replay shards) and the objects
built from them must carry those values: no second default can hide a setting.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from actorrl.algorithms import get_algorithm
from actorrl.config.algorithm import AlgorithmConfig, load_config
from actorrl.config.loading import FLAT_KEYS, load_worker_config
from actorrl.config.sections import ALGORITHM, WORKER, ConfigError, ConfigSection
from actorrl.learner.config import LearnerConfig
from actorrl.replay.actor import ReplayActor, shard_config
from actorrl.rollout import RolloutWorker

COMMON = {
    "env": "Acrobot-v1", "env_config": {"k": 1}, "num_workers": 3, "seed": 7,
    "num_gpus": 2.0, "_fake_gpus": True, "min_iter_time_s": 0.5,
    "num_cpus_per_worker": 0.5, "num_cpus_for_driver": 2.0,
    "timesteps_per_iteration": 10, "metrics_smoothing_episodes": 7,
    "num_envs_per_worker": 3, "rollout_fragment_length": 10, "explore": False,
    "clip_actions": True, "normalize_actions": False, "observation_filter": "MeanStdFilter",
    "horizon": 321,
    "multiagent": {"policies_to_train": ["default_policy"]},
    "lr": 0.123, "gamma": 0.9, "grad_clip": 3.0, "lr_schedule": [[0.0, 0.1], [50.0, 0.01]],
    "callbacks": "tests.actors.callbacks:CountingCallbacks",
    "evaluation_interval": 3, "evaluation_duration": 4, "evaluation_duration_unit": "timesteps",
    "evaluation_num_workers": 2, "evaluation_config": {"explore": True}, "record_env": "clips",
    "model": {"fcnet_hiddens": [7], "fcnet_activation": "relu"},
    "preprocessor_pref": "rllib",
}
LEARNER = {"num_sgd_iter": 2, "minibatch_buffer_size": 2, "learner_queue_size": 5,
           "learner_queue_timeout": 9.0, "num_multi_gpu_tower_stacks": 2,
           "num_data_load_threads": 2}
ACTOR_CRITIC = {"lambda": 0.5, "use_gae": False, "use_critic": False,
                "vf_loss_coeff": 0.25, "entropy_coeff": 0.02,
                "entropy_coeff_schedule": [[0.0, 0.3], [10.0, 0.0]],
                "batch_mode": "complete_episodes"}
NON_DEFAULT: dict[str, dict[str, Any]] = {
    "apex": {
        **COMMON, **LEARNER, "batch_mode": "complete_episodes", "train_batch_size": 40,
        "adam_epsilon": 1e-3, "n_step": 2, "double_q": False, "dueling": False,
        "hiddens": [5], "huber_threshold": 2.0, "target_network_update_freq": 77,
        "exploration_config": {"type": "PerWorkerEpsilonGreedy", "initial_epsilon": 0.5,
                               "final_epsilon": 0.1, "epsilon_timesteps": 99},
        "per_worker_exploration": True, "buffer_size": 999, "learning_starts": 11,
        "prioritized_replay": False, "prioritized_replay_alpha": 0.5,
        "prioritized_replay_beta": 0.3, "prioritized_replay_eps": 1e-3,
        "num_replay_buffer_shards": 3, "batch_replay": True,
        "worker_side_prioritization": True, "max_weight_sync_delay": 33,
        "compress_observations": True,
        "training_intensity": 2.0, "debug": True,
    },
    "impala": {
        **COMMON, **LEARNER, "train_batch_size": 40, "vtrace": False,
        "vtrace_clip_rho_threshold": 2.0, "vtrace_clip_pg_rho_threshold": 3.0,
        "vf_loss_coeff": 0.25, "entropy_coeff": 0.02, "opt_type": "rmsprop", "decay": 0.9,
        "momentum": 0.1, "epsilon": 0.2, "max_sample_requests_in_flight_per_worker": 3,
        "entropy_coeff_schedule": [[0.0, 0.3], [10.0, 0.0]],
        "broadcast_interval": 2,
    },
    "a3c": {**COMMON, **ACTOR_CRITIC, "train_batch_size": 40, "grads_per_step": 7},
    "a2c": {**COMMON, **ACTOR_CRITIC, "train_batch_size": 40, "microbatch_size": 20},
    "appo": {
        **COMMON, **LEARNER, "train_batch_size": 40, "vtrace": False,
        "vtrace_clip_rho_threshold": 2.0, "vtrace_clip_pg_rho_threshold": 3.0,
        "vf_loss_coeff": 0.25, "entropy_coeff": 0.02, "opt_type": "rmsprop", "decay": 0.9,
        "momentum": 0.1, "epsilon": 0.2, "max_sample_requests_in_flight_per_worker": 3,
        "entropy_coeff_schedule": [[0.0, 0.3], [10.0, 0.0]], "broadcast_interval": 2,
        "clip_param": 0.2, "use_kl_loss": True, "kl_coeff": 0.5, "kl_target": 0.02,
        "lambda": 0.5, "use_gae": False, "use_critic": False, "target_update_frequency": 3,
    },
    "ppo": {**COMMON, **LEARNER, **ACTOR_CRITIC, "train_batch_size": 40,
            "sgd_minibatch_size": 20, "shuffle_sequences": False, "clip_param": 0.2,
            "vf_clip_param": 5.0, "kl_coeff": 0.3, "kl_target": 0.02, "use_kl_loss": False},
}
NON_DEFAULT["dqn"] = {**NON_DEFAULT["apex"], "final_prioritized_replay_beta": 0.9,
                      "prioritized_replay_beta_annealing_timesteps": 99}
"""DQN has Ape-X's keys (other defaults: RLlib's DQN), so Ape-X's values are non-default
for it too, and anneals beta."""
_DQN_ONLY = {"adam_epsilon", "double_q", "dueling", "hiddens", "per_worker_exploration",
             "batch_replay", "lr_schedule"}
_DDPG = {"policy_delay": 3, "smooth_target_policy": True, "target_noise": 0.3,
         "target_noise_clip": 0.4, "actor_hiddens": [5, 6], "actor_hidden_activation": "tanh",
         "critic_hiddens": [7, 8], "critic_hidden_activation": "elu", "actor_lr": 0.01,
         "critic_lr": 0.02, "l2_reg": 0.5, "no_done_at_end": True, "tau": 0.3, "twin_q": True,
         "use_huber": True,
         "exploration_config": {"type": "GaussianNoise", "random_timesteps": 5, "stddev": 0.3,
                                "initial_scale": 0.9, "final_scale": 0.1,
                                "scale_timesteps": 7}}
NON_DEFAULT["ddpg"] = {**{k: v for k, v in NON_DEFAULT["dqn"].items() if k not in _DQN_ONLY},
                       **_DDPG}
NON_DEFAULT["td3"] = {**NON_DEFAULT["ddpg"], "twin_q": False, "smooth_target_policy": False,
                      "prioritized_replay": True,
                      "exploration_config": {**_DDPG["exploration_config"],
                                             "type": "OrnsteinUhlenbeckNoise", "ou_theta": 0.1,
                                             "ou_sigma": 0.3, "ou_base_scale": 0.2,
                                             "stddev": None}}
del NON_DEFAULT["td3"]["exploration_config"]["stddev"]
NON_DEFAULT["apex_ddpg"] = {**{k: v for k, v in NON_DEFAULT["apex"].items()
                               if k not in _DQN_ONLY}, **_DDPG,
                            "worker_side_prioritization": False}
"""DDPG, TD3 and Ape-X DDPG have DQN's and Ape-X's replay keys without the Q-network's
(``batch_replay`` and ``lr_schedule`` they refuse), and DDPG's policy keys."""
NON_DEFAULT["sac"] = {
    **{k: v for k, v in NON_DEFAULT["dqn"].items()
       if k not in _DQN_ONLY | {"exploration_config", "huber_threshold",
                                "worker_side_prioritization"}},
    "twin_q": False, "q_model_config": {"fcnet_hiddens": [5]},
    "policy_model_config": {"fcnet_hiddens": [6], "fcnet_activation": "tanh"}, "tau": 0.3,
    "initial_alpha": 0.5, "target_entropy": -3.0, "no_done_at_end": True,
    "exploration_config": {"type": "StochasticSampling", "random_timesteps": 7},
    "optimization": {"actor_learning_rate": 0.01, "critic_learning_rate": 0.02,
                     "entropy_learning_rate": 0.03},
    "actor_lr": 0.04, "critic_lr": 0.05, "alpha_lr": 0.06}
"""SAC has DQN's replay keys without the Q-network's and epsilon's (batch replay, worker-side
priorities and ``lr_schedule`` it refuses), and its own policy keys; discrete here
(CartPole), where ``normalize_actions: false`` is allowed."""
CONTINUOUS = {"ddpg", "td3", "apex_ddpg"}
"""Algorithms for Box actions only: their components are built on Pendulum-v1."""
FIXED = {"impala": {"batch_mode"}, "appo": {"batch_mode"},
         "apex": {"final_prioritized_replay_beta", "prioritized_replay_beta_annealing_timesteps"},
         "ddpg": {"batch_replay", "lr_schedule"}, "td3": {"batch_replay", "lr_schedule"},
         "apex_ddpg": {"batch_replay", "lr_schedule", "final_prioritized_replay_beta",
                       "prioritized_replay_beta_annealing_timesteps"},
         "sac": {"batch_replay", "lr_schedule", "worker_side_prioritization"}}
"""Keys with one valid value for an algorithm (IMPALA and APPO need truncated fragments;
Ape-X's beta is constant, as RLlib's: its flat beta-annealing keys are ignored)."""
PROVED_ELSEWHERE = {
    "record_env": "tests/test_videos.py::"
                  "test_record_env_writes_the_evaluation_episodes_into_the_results_folder",
}
"""Keys whose reading a dedicated test proves end to end (a real training that writes what
the key asks for), where no component carries them and the trainer cases below do not
run what they need (the video extra, rendering envs)."""
LOAD_ONLY = {"preprocessor_pref"}
"""Keys read only when the config loads (RLlib's switch between its preprocessors: actorrl
always preprocesses Atari ids the DeepMind way): no component carries them, so
:func:`test_load_only_keys_are_read_at_load` proves each read (a bad value is refused, a
value actorrl does not honour warns)."""
def plain(value: Any) -> Any:
    """Comparable form: sections as dicts, tuples as lists."""
    if isinstance(value, ConfigSection):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    return value


def leaf_keys(config: AlgorithmConfig) -> set[str]:
    """The flat (RLlib) name of every setting of ``config``."""
    out = set()
    for key, value in config.to_dict().items():
        if key in type(config).SECTIONS:
            out.update(value)
        else:
            out.add(key)
    return out


def components(name: str, config: AlgorithmConfig) -> dict[str, ConfigSection]:
    """The dataclass each component of ``config`` receives, by section name."""
    spec = get_algorithm(name)
    worker = config.worker_config()
    out: dict[str, ConfigSection] = {"rollout": worker.rollout, "policy": worker.policy}
    if "learner" in type(config).SECTIONS:
        assert spec.learner_config is not None
        out["learner"] = spec.learner_config(config)
    if "replay" in type(config).SECTIONS:
        out["replay"] = config.component("replay")
    return out


def expected_value(config: AlgorithmConfig, section: str, f: dataclasses.Field,
                   values: dict[str, Any]) -> Any:
    """What field ``f`` of component ``section`` must hold for the config built from
    ``values`` (the same value the user gave, wherever it is read)."""
    key = f.name.rstrip("_") if not f.name.startswith("_") else f.name
    origin = f.metadata.get("derived_from")
    overrides = config.derived_values(section)
    if f.name in overrides:
        return overrides[f.name]
    if origin in (None,):
        assert FLAT_KEYS[key] == f"{section}.{key}"
        return values[key]
    assert origin not in (WORKER, ALGORITHM), f"{section}.{f.name} needs an override"
    return values[origin.rsplit(".", 1)[-1]]


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_every_key_reaches_its_component_with_the_same_value(name: str) -> None:
    spec = get_algorithm(name)
    values = NON_DEFAULT[name]
    config = load_config(spec.config_cls, values)
    assert leaf_keys(config) - FIXED.get(name, set()) == set(values), (
        "give every key a non-default value here")
    defaults = spec.config_cls()
    for key, value in values.items():
        assert plain(getattr(config, key)) == value, key
        assert plain(getattr(defaults, key)) != value, f"{key}: pick a non-default value"
    reached: set[str] = set()
    for section, component in components(name, config).items():
        for f in dataclasses.fields(component):
            if f.metadata.get("derived_from") == WORKER or f.name in FIXED.get(name, ()):
                continue
            expected = expected_value(config, section, f, values)
            assert plain(getattr(component, f.name)) == expected, f"{section}.{f.name}"
            reached.add(f.name.rstrip("_") if not f.name.startswith("_") else f.name)
    # What no component carries must be proved read by the trainer test below (through the
    # actors, learner, pipeline and results the trainer made): no key is exempt.
    unproved = (set(values) - reached - trainer_read_keys(name) - LOAD_ONLY
                - set(PROVED_ELSEWHERE))
    assert unproved == set(), f"{name}: no component or trainer case shows {sorted(unproved)}"
    if "learner" not in type(config).SECTIONS and spec.learner_config is not None:
        # A3C/A2C learners only apply gradients: of their settings only the batch size
        assert spec.learner_config(config).train_batch_size == values["train_batch_size"]


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_components_built_from_the_wire_form_keep_every_value(name: str) -> None:
    """What the actors receive (``to_dict()`` over the wire) loads back to the same
    dataclasses, and the objects built from them carry them."""
    spec = get_algorithm(name)
    env = "Pendulum-v1" if name in CONTINUOUS else "CartPole-v1"
    config = load_config(spec.config_cls, {**NON_DEFAULT[name], "env": env,
                                           "env_config": {}})
    parts = components(name, config)
    worker_dict = config.worker_config().to_dict()
    policy_cls = RolloutWorker(env, spec.policy, worker_dict).get_policy()
    worker = RolloutWorker(env, spec.policy, worker_dict, worker_index=2,
                           num_workers=3)
    try:
        assert worker.rollout_config == parts["rollout"]
        policy_config = worker.get_policy().config
        fields = {f.name for f in dataclasses.fields(policy_config)}
        context = {k: v for k, v in {"worker_index": 2, "num_workers": 3}.items()
                   if k in fields}
        assert policy_config == parts["policy"].replace(**context)
    finally:
        worker.stop()
    action_space = (gym.spaces.Box(-1, 1, (1,)) if name in CONTINUOUS
                    else gym.spaces.Discrete(2))
    policy = type(policy_cls)(gym.spaces.Box(-1, 1, (4,)), action_space, parts["policy"])
    assert policy.config is parts["policy"]
    assert load_worker_config(worker_dict, type(parts["policy"])) == config.worker_config()
    if "learner" in parts:
        learner_cls = type(parts["learner"])
        assert issubclass(learner_cls, LearnerConfig)
        assert learner_cls.load(parts["learner"].to_dict()) == parts["learner"]
    if "replay" in parts:
        assert shard_config(parts["replay"].to_dict()) == parts["replay"]
        shard = ReplayActor(parts["replay"].to_dict(), seed=0)
        assert shard.config == parts["replay"]
        assert shard.buffer_size == 999 // 3 and shard.replay_starts == 11 // 3


def test_the_flat_key_table_matches_the_algorithm_configs() -> None:
    """Each algorithm's every setting has exactly its own entry in FLAT_KEYS, and every
    entry is a setting of some algorithm."""
    used = set()
    for name in NON_DEFAULT:
        config = get_algorithm(name).config_cls()
        for key, value in config.to_dict().items():
            if key in type(config).SECTIONS:
                for leaf in value:
                    assert FLAT_KEYS[leaf] == f"{key}.{leaf}", leaf
                    used.add(leaf)
            else:
                assert FLAT_KEYS[key] == key
                used.add(key)
    assert used == set(FLAT_KEYS)


def test_load_only_keys_are_read_at_load(recwarn: pytest.WarningsRecorder) -> None:
    """``preprocessor_pref``: RLlib's values load; one actorrl does not honour on an Atari
    id warns naming the key; anything else is refused naming it."""
    impala = get_algorithm("impala").config_cls
    assert load_config(impala, {"preprocessor_pref": "deepmind"}).preprocessor_pref == \
        "deepmind"
    assert not [w for w in recwarn if "preprocessor_pref" in str(w.message)]
    with pytest.warns(UserWarning, match="preprocessor_pref"):
        load_config(impala, {"env": "PongNoFrameskip-v4", "preprocessor_pref": "rllib"})
    with pytest.raises(ConfigError, match="preprocessor_pref"):
        load_config(impala, {"preprocessor_pref": "pixels"})


def test_unknown_keys_are_refused_with_their_path_and_suggestions() -> None:
    apex = get_algorithm("apex").config_cls
    cases = {
        "replay.alpha": ({"replay": {"alpha": 0.5}}, "prioritized_replay_alpha"),
        "buffer_sise": ({"buffer_sise": 10}, "buffer_size"),
        "exploration_config.final_epsilonn": (
            {"exploration_config": {"final_epsilonn": 0.1}}, "final_epsilon"),
        "model.fcnet_hiden": ({"model": {"fcnet_hiden": [3]}}, "fcnet_hiddens"),
        "policy.model.fcnet_hiden": ({"policy": {"model": {"fcnet_hiden": [3]}}},
                                     "fcnet_hiddens"),
        "learner.num_sgd_iters": ({"learner": {"num_sgd_iters": 2}}, "num_sgd_iter"),
    }
    for path, (values, suggestion) in cases.items():
        with pytest.raises(ConfigError) as info:
            load_config(apex, values)
        assert re.search(rf"'?{re.escape(path)}'?", str(info.value)), str(info.value)
        assert suggestion in str(info.value)
    with pytest.raises(ConfigError, match="'policy.train_batch_size' is not set here"):
        load_config(apex, {"policy": {"train_batch_size": 3}})
    with pytest.raises(ConfigError, match="unknown config key 'vtrace'"):
        load_config(apex, {"vtrace": False})  # an IMPALA key
    with pytest.raises(ConfigError, match="unknown config key 'replay'"):
        load_config(get_algorithm("impala").config_cls, {"replay": {}})


def test_flat_dicts_and_saved_configs_load_to_the_same_config() -> None:
    """Old flat (RLlib-style) checkpoint configs and ``to_dict()`` output both load; a
    flat key next to its section overrides it (``--set`` over a file)."""
    cls = get_algorithm("a3c").config_cls
    flat = {"lr": 0.01, "lambda": 0.9, "model": {"fcnet_hiddens": [8]},
            "num_envs_per_worker": 2, "train_batch_size": 100}
    config = load_config(cls, flat)
    assert config.policy.lambda_ == 0.9 and config.rollout.num_envs_per_worker == 2
    assert load_config(cls, config.to_dict()) == config
    assert load_config(cls, {**config.to_dict(), "lr": 0.5}).policy.lr == 0.5
    assert config.replace(lr=0.5).policy.lr == 0.5 and config.lr == 0.01


def test_no_from_dict_drops_keys() -> None:
    """The component configs have no lenient ``from_dict`` left."""
    root = Path(__file__).resolve().parent.parent / "actorrl"
    offenders = [str(p) for p in root.rglob("*.py") if "def from_dict" in p.read_text()]
    assert offenders == []


# ---- keys the trainer and its pipeline read ----------------------------------------------
class RecordingDriver:
    """A serial driver that records each actor the trainer asks it for (a GPU request is
    recorded, then served on the CPU: the request is what the trainer decided)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.created: list[dict[str, Any]] = []
        self.steps = 0
        """Pipeline steps run by the trainer (counted by the test)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    async def create_actor(self, class_path: str, args: Any = (), kwargs: Any = None,
                           **options: Any) -> Any:
        self.created.append({"class_path": class_path, "args": args, "kwargs": kwargs,
                             **options})
        options = {**options, "num_gpus": 0.0} if options.get("num_gpus") else options
        return await self.driver.create_actor(class_path, args, kwargs, **options)

    def made(self, name_prefix: str) -> list[dict[str, Any]]:
        """The recorded creations whose actor name starts with ``name_prefix``."""
        return [c for c in self.created if c.get("name", "").startswith(name_prefix)]

    def instance(self, handle: Any) -> Any:
        """The object a serial actor runs (built in this process)."""
        return self.driver.node.actors[handle.actor_id].instance


TICK_S = 0.125
"""Each reading of the trainer's iteration clock is this much later (exact in binary)."""


class TickingClock:
    """The trainer module's ``time`` during the trainer test: ``perf_counter`` advances
    :data:`TICK_S` per reading, so ``min_iter_time_s`` means a known number of pipeline
    steps however fast the machine is (one reading per step, one at the start)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += TICK_S
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


SMALL = {"env": "Acrobot-v1", "num_workers": 3, "seed": 5, "min_iter_time_s": 0.5,
         "metrics_smoothing_episodes": 7,
         "num_cpus_per_worker": 0.5, "num_cpus_for_driver": 0.25, "num_gpus": 2,
         "_fake_gpus": True, "rollout_fragment_length": 16, "num_envs_per_worker": 1,
         "model": {"fcnet_hiddens": [8]}, "evaluation_interval": 1,
         "evaluation_duration": 40, "evaluation_duration_unit": "timesteps",
         "evaluation_num_workers": 2, "evaluation_config": {"explore": True}}
"""``min_iter_time_s`` 0.5 = 4 ticks = 4 pipeline steps (``timesteps_per_iteration`` stays 0,
so it cannot hide a missing time bound)."""
STEPS = {"num_workers": 1, "min_iter_time_s": 0, "timesteps_per_iteration": 400,
         "rollout_fragment_length": 16, "model": {"fcnet_hiddens": [8]}}
"""An iteration bounded by env steps only: 400 is more than any one pipeline step samples
here (at most a few 16-step fragments), so only a read ``timesteps_per_iteration`` gets
there (and ``min_iter_time_s`` 0 cannot hide it)."""
COMMON_READ = {"env", "num_workers", "seed", "min_iter_time_s", "metrics_smoothing_episodes",
               "num_cpus_per_worker", "num_cpus_for_driver", "_fake_gpus", "train_batch_size",
               "evaluation_interval", "evaluation_duration", "evaluation_duration_unit",
               "evaluation_num_workers", "evaluation_config"}
REPLAY_CASE = {**SMALL, "debug": True, "train_batch_size": 32, "max_weight_sync_delay": 33,
               "training_intensity": 2.0, "learning_starts": 64, "learner_queue_size": 5,
               "num_replay_buffer_shards": 2, "batch_replay": True, "buffer_size": 2000,
               "prioritized_replay": False, "hiddens": [8]}
"""Ape-X's and DQN's trainer case (the replay pipeline)."""
DDPG_CASE = {**{k: v for k, v in REPLAY_CASE.items() if k not in ("batch_replay", "hiddens")},
             "env": "Pendulum-v1", "actor_hiddens": [8], "critic_hiddens": [8],
             "timesteps_per_iteration": 0}
"""DDPG's, TD3's and Ape-X DDPG's trainer case (the replay pipeline on a Box env; their
iterations' env-step minimum set to 0 as Ape-X DQN's, so the time bound shows)."""
REPLAY_READ = COMMON_READ | {"num_gpus", "debug", "max_weight_sync_delay", "training_intensity",
                             "learning_starts", "learner_queue_size",
                             "num_replay_buffer_shards", "batch_replay"}
SAMPLES_CASE = {**SMALL, "train_batch_size": 64, "broadcast_interval": 3,
                "learner_queue_size": 5, "max_sample_requests_in_flight_per_worker": 3}
"""IMPALA's and APPO's trainer case (the asynchronous samples pipeline)."""
SAMPLES_READ = COMMON_READ | {"num_gpus", "broadcast_interval", "learner_queue_size",
                              "max_sample_requests_in_flight_per_worker"}
TRAINER_CASES: dict[str, tuple[str, dict[str, Any], set[str]]] = {
    "apex": ("apex", REPLAY_CASE, REPLAY_READ),
    "impala": ("impala", SAMPLES_CASE, SAMPLES_READ),
    "a3c": ("a3c", {**SMALL, "train_batch_size": 40, "grads_per_step": 3},
            COMMON_READ | {"grads_per_step"}),
    "a2c": ("a2c", {**SMALL, "train_batch_size": 64, "microbatch_size": 32},
            COMMON_READ | {"microbatch_size"}),
    # A3C and A2C build no towers: num_gpus shows only in the learner's GPU request, which
    # _fake_gpus (above) zeroes; here it is not faked.
    "apex-steps": ("apex", {**STEPS, "learning_starts": 10_000}, {"timesteps_per_iteration"}),
    "dqn": ("dqn", {**REPLAY_CASE, "train_batch_size": 48}, REPLAY_READ),
    "dqn-steps": ("dqn", {**STEPS, "learning_starts": 10_000}, {"timesteps_per_iteration"}),
    "impala-steps": ("impala", STEPS, {"timesteps_per_iteration"}),
    "a3c-steps": ("a3c", {**STEPS, "num_gpus": 1, "grads_per_step": 2},
                  {"timesteps_per_iteration", "num_gpus"}),
    "a2c-steps": ("a2c", {**STEPS, "num_gpus": 1, "train_batch_size": 64,
                          "microbatch_size": 32}, {"timesteps_per_iteration", "num_gpus"}),
    "appo": ("appo", SAMPLES_CASE, SAMPLES_READ),
    "appo-steps": ("appo", STEPS, {"timesteps_per_iteration"}),
    "ppo": ("ppo", {**SMALL, "train_batch_size": 96, "sgd_minibatch_size": 32},
            COMMON_READ | {"num_gpus"}),
    "ppo-steps": ("ppo", {**STEPS, "train_batch_size": 128, "sgd_minibatch_size": 32},
                  {"timesteps_per_iteration"}),
    **{name: (name, DDPG_CASE, REPLAY_READ - {"batch_replay"}) for name in CONTINUOUS},
    "sac": ("sac", {**{k: v for k, v in REPLAY_CASE.items() if k not in ("batch_replay",
                                                                        "hiddens")},
                    "q_model_config": {"fcnet_hiddens": [8]},
                    "policy_model_config": {"fcnet_hiddens": [8]},
                    "timesteps_per_iteration": 0}, REPLAY_READ - {"batch_replay"}),
    "sac-steps": ("sac", {**STEPS, "learning_starts": 10_000}, {"timesteps_per_iteration"}),
    **{f"{name}-steps": (name, {**STEPS, "env": "Pendulum-v1", "learning_starts": 10_000},
                         {"timesteps_per_iteration"}) for name in CONTINUOUS},
}
"""Case -> (algorithm, a small config, the trainer keys it proves read). Together an
algorithm's cases prove every key no component carries (see
:func:`test_every_key_reaches_its_component_with_the_same_value`), each with a value that
is not the default."""


def trainer_read_keys(algorithm: str) -> set[str]:
    """The keys the trainer test proves read for ``algorithm``."""
    return set().union(*(keys for name, _, keys in TRAINER_CASES.values()
                         if name == algorithm))


def _learner(t: Any, d: RecordingDriver) -> Any:
    return d.instance(t.learner)


def _learner_queue_applied(trainer: Any, driver: RecordingDriver) -> bool:
    """The learner's in-queue holds 5, and Ape-X's credit window is one more."""
    learner = _learner(trainer, driver)
    credits = getattr(trainer.pipeline, "credits", None)
    return learner.config.learner_queue_size == 5 and (credits is None
                                                          or credits.size == 5 + 1)


def _towers(t: Any, d: RecordingDriver) -> list[list[str]]:
    """The devices of the towers the learner built, per policy (none: not multi-tower)."""
    towers = getattr(_learner(t, d).thread, "towers", {})
    return [[str(device) for device in tower_set.devices] for tower_set in towers.values()]


def _batch_size_received(t: Any, d: RecordingDriver) -> int:
    """The train batch size the learner (or A2C's microbatch pipeline) works with."""
    microbatch = getattr(t.pipeline, "train_batch_size", None)
    return microbatch if microbatch is not None else _learner(t, d).config.train_batch_size


OBS_SHAPES = {"Acrobot-v1": (6,), "Pendulum-v1": (3,)}
"""The observation shape of the trainer cases' envs (the workers built them)."""
READS: dict[str, Any] = {
    "env": lambda t, d, r: {c["args"][0] for c in d.made("worker")} == {t.config.env}
    != {type(t.config)().env}
    and {d.instance(w).worker.env.observation_space.shape for w in t.workers}
    == {OBS_SHAPES[t.config.env]},
    "num_workers": lambda t, d, r: len(d.made("worker")) == 3 == len(t.workers)
    == r["num_healthy_workers"],
    "seed": lambda t, d, r: [d.instance(w).worker.seed for w in t.workers] == [5, 5, 5],
    "num_gpus": lambda t, d, r: (_towers(t, d) == [["cpu", "cpu"]] if t.config._fake_gpus
                                 else d.made("learner")[0]["num_gpus"] == 1.0),
    "_fake_gpus": lambda t, d, r: d.made("learner")[0]["num_gpus"] == 0.0
    and all(device == "cpu" for tower in _towers(t, d) for device in tower),
    "min_iter_time_s": lambda t, d, r: d.steps == 4,
    "timesteps_per_iteration": lambda t, d, r: r["timesteps_this_iter"] >= 400,
    "metrics_smoothing_episodes": lambda t, d, r: t.episodes.smoothing_episodes == 7,
    "num_cpus_per_worker": lambda t, d, r: {c["num_cpus"] for c in d.made("worker")} == {0.5},
    "num_cpus_for_driver": lambda t, d, r: d.made("learner")[0]["num_cpus"] == 0.25,
    "debug": lambda t, d, r: t.pipeline.debug is True,
    "train_batch_size": lambda t, d, r: _batch_size_received(t, d) == t.config.train_batch_size
    != type(t.config)().train_batch_size,
    "max_weight_sync_delay": lambda t, d, r: t.pipeline.max_weight_sync_delay == 33,
    "training_intensity": lambda t, d, r: t.pipeline.intensity.intensity == 2.0,
    "learning_starts": lambda t, d, r: t.pipeline.intensity.learning_starts == 64,
    "learner_queue_size": lambda t, d, r: _learner_queue_applied(t, d),
    "num_replay_buffer_shards": lambda t, d, r: len(d.made("replay")) == 2
    == len(t.learner_side_actors),
    "batch_replay": lambda t, d, r: {c["class_path"] for c in d.made("replay")}
    == {"actorrl.replay.actor:BatchReplayActor"},
    "broadcast_interval": lambda t, d, r: t.pipeline.broadcast_interval == 3,
    "max_sample_requests_in_flight_per_worker":
        lambda t, d, r: t.pipeline.samples_in_flight == 3,
    "grads_per_step": lambda t, d, r: t.pipeline.grads_per_step == 3,
    "microbatch_size": lambda t, d, r: t.pipeline.microbatch_size == 32,
    "evaluation_interval": lambda t, d, r: "evaluation" in r,
    "evaluation_num_workers": lambda t, d, r: len(d.made("evaluation-worker")) == 2,
    "evaluation_duration": lambda t, d, r: r["evaluation"]["timesteps_this_iter"] >= 40,
    "evaluation_duration_unit": lambda t, d, r: t.evaluator.unit == "timesteps"
    and r["evaluation"]["timesteps_this_iter"] >= 40,
    "evaluation_config": lambda t, d, r: all(
        c["args"][2].rollout.explore is True for c in d.made("evaluation-worker")),
}
"""Trainer key -> what shows it reached what reads it: the actors the trainer started
(their constructor arguments and the objects they built: count, class, CPUs, GPUs, seeds,
towers), the pipeline it built, or one training iteration's result (pipeline steps run,
env steps sampled). What each pipeline setting then changes is shown by the pipeline tests
(tests/test_pipelines.py: max_weight_sync_delay, training_intensity, learning_starts,
learner_queue_size, grads_per_step, microbatch_size; tests/test_pipeline_stats.py)."""


def test_every_trainer_key_is_read_by_the_trainer_or_pipeline() -> None:
    """Each proved key has a check here, and each case gives every key it proves a value
    that is not the default."""
    assert set().union(*(keys for _, _, keys in TRAINER_CASES.values())) == set(READS)
    for case, (name, values, keys) in TRAINER_CASES.items():
        spec = get_algorithm(name)
        config = load_config(spec.config_cls, values)
        defaults = spec.config_cls()
        assert keys <= leaf_keys(config) & set(values), (case, keys - set(values))
        for key in keys:
            assert plain(getattr(config, key)) != plain(getattr(defaults, key)), (case, key)


@pytest.mark.parametrize("case", sorted(TRAINER_CASES))
async def test_trainer_keys_reach_the_actors_pipeline_and_iterations(
        case: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer built from the case (serial: every actor in this process) started its
    actors as the keys say, built its pipeline with them, and one iteration (on a clock
    that ticks per reading, so it is bounded by pipeline steps, not the machine's speed)
    respects ``min_iter_time_s`` and ``timesteps_per_iteration``."""
    import actorrl.algorithms.trainer as trainer_module
    from actorrl.algorithms.trainer import Trainer
    from actorrl.runtime import Driver

    name, values, keys = TRAINER_CASES[case]
    spec = get_algorithm(name)
    config = load_config(spec.config_cls, values)
    monkeypatch.setattr(trainer_module, "time", TickingClock())
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        recording = RecordingDriver(driver)
        trainer = await Trainer.create(spec, config, recording)  # type: ignore[arg-type]
        try:
            assert trainer.pipeline is not None
            step = trainer.pipeline.step

            async def counted_step() -> Any:
                recording.steps += 1
                return await step()

            trainer.pipeline.step = counted_step  # type: ignore[method-assign]
            result = await trainer.train()
            failed = sorted(k for k in keys if not READS[k](trainer, recording, result))
        finally:
            await trainer.stop()
    assert failed == [], f"{case}: not applied: {failed}"
