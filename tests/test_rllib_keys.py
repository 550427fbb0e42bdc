"""RLlib's other spellings of actorrl's settings (``actorrl.config.aliases``), as a table:
every alias sets what its canonical key sets, every accepted-and-ignored key warns once
and changes nothing, refused values name their key, suggestions never propose a key with
another meaning; RLlib 2.x files load and one trains through the CLI; a file asking for
more workers than the machine has cores starts with a warning.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from actorrl.algorithms import algorithm_names, get_algorithm
from actorrl.algorithms.stop import StopCriteria
from actorrl.config.algorithm import config_fields, load_config
from actorrl.config.aliases import (
    ALIASES,
    IGNORED,
    IGNORED_SUBKEYS,
    STOP_ALIASES,
    RLlibKeyWarning,
)
from actorrl.config.sections import ConfigError
from actorrl.experiment.errors import UsageError
from actorrl.experiment.train import plan_training, read_config_file_sections
from tests.helpers.cluster import read_jsonl, run_cli, run_dirs

SAMPLES: dict[str, Any] = {
    # canonical key -> a value other than every algorithm's default
    "rollout_fragment_length": 4, "num_multi_gpu_tower_stacks": 2, "num_workers": 3,
    "num_envs_per_worker": 3, "num_cpus_per_worker": 0.5, "evaluation_num_workers": 2,
    "evaluation_duration": 7, "record_env": True, "learning_starts": 123,
    "timesteps_per_iteration": 77,
    "min_iter_time_s": 0.25, "num_sgd_iter": 3, "train_batch_size": 96,
    "buffer_size": 4321, "prioritized_replay": False, "prioritized_replay_alpha": 0.5,
    "prioritized_replay_beta": 0.5, "prioritized_replay_eps": 1e-5,
    "worker_side_prioritization": True, "num_replay_buffer_shards": 2,
    "max_weight_sync_delay": 100, "debug": True, "grads_per_step": 7, "num_gpus": 2,
    "_fake_gpus": True, "sgd_minibatch_size": 64, "grad_clip": 5.0, "num_cpus_for_driver": 2,
    "metrics_smoothing_episodes": 7, "exploration_config": {"epsilon_timesteps": 777},
    "q_model_config": {"fcnet_hiddens": [64]}, "policy_model_config": {"fcnet_hiddens": [32]},
}
ALIAS_CONTEXT: dict[str, dict[str, Any]] = {
    # canonical key -> other keys it needs to load (record_env records evaluations)
    "record_env": {"evaluation_interval": 1},
}
ALIAS_INPUT: dict[str, Any] = {
    # alias -> the value written under it, when it differs from the canonical's value
    "replay_buffer_config.type": "MultiAgentReplayBuffer",
}
IGNORED_OFF: dict[str, Any] = {
    # key -> a value that changes nothing (see IGNORED)
    "framework": "tf2", "use_pytorch": True, "eager": False, "eager_tracing": False,
    "_enable_rl_module_api": True, "_enable_learner_api": True,
    "_enable_new_api_stack": False, "enable_rl_module_and_learner": False,
    "enable_env_runner_and_connector_v2": False, "num_learner_workers": 0,
    "num_learners": 0, "num_gpus_per_learner_worker": 0, "num_gpus_per_learner": 0,
    "num_gpus_per_worker": 0, "num_gpus_per_env_runner": 0.0, "num_atoms": 1,
    "noisy": False, "v_min": -10.0, "v_max": 10.0, "sigma0": 0.5, "replay_ratio": 0.0,
    "replay_proportion": 0, "replay_buffer_num_slots": 0, "vtrace_drop_last_ts": False,
    "evaluation_parallel_to_training": False, "log_level": "WARN",
    "create_env_on_driver": False, "disable_env_checking": True,
    "tf_session_args": {"intra_op_parallelism_threads": 2}, "local_tf_session_args": {},
    "replay_buffer_config.no_local_replay_buffer": True,
    "replay_buffer_config.replay_buffer_shards_colocated_with_driver": True,
    "replay_buffer_config._enable_replay_buffer_api": True,
    "replay_buffer_config.replay_sequence_length": 1,
    "replay_buffer_config.replay_burn_in": 0,
    "replay_buffer_config.replay_zero_init_states": True,
    "replay_buffer_config.storage_unit": "timesteps",
    "replay_buffer_config.min_size_for_sampling": 1000,
    "enable_connectors": True, "_disable_execution_plan_api": True,
    "_tf_policy_handles_more_than_one_loss": True, "_separate_vf_optimizer": False,
    "_lr_vf": 0.001, "num_aggregation_workers": 2, "object_store_memory": 0,
    "object_store_memory_per_worker": 0, "num_accs_per_worker": 0, "no_done_at_end": False,
    "num_cpus_per_learner_worker": 1, "grad_clip_by": "global_norm", "soft_horizon": False,
    "use_state_preprocessor": False,
}
REFUSED: dict[str, Any] = {
    # key -> a value that would change learning and that actorrl cannot honour
    "framework": "jax", "num_learner_workers": "two", "num_learners": 1.5,
    "num_gpus_per_learner_worker": 1, "num_gpus_per_learner": 1, "num_gpus_per_worker": 1,
    "num_gpus_per_env_runner": 0.5, "num_atoms": 51, "noisy": True, "replay_ratio": 0.5,
    "replay_proportion": 0.25, "replay_buffer_num_slots": 100, "vtrace_drop_last_ts": True,
    "_separate_vf_optimizer": True,
    "num_accs_per_worker": 1, "no_done_at_end": True, "grad_clip_by": "value",
    "create_env_on_driver": True, "use_pytorch": "yes", "eager": 1, "eager_tracing": "no",
    "_enable_rl_module_api": 1, "_enable_learner_api": "x", "_enable_new_api_stack": 0,
    "enable_rl_module_and_learner": "yes", "enable_env_runner_and_connector_v2": 1,
    "disable_env_checking": "x", "soft_horizon": True, "use_state_preprocessor": True,
    "replay_buffer_config._enable_replay_buffer_api": "x",
    "replay_buffer_config.replay_sequence_length": 20,
    "replay_buffer_config.replay_burn_in": 10,
    "replay_buffer_config.replay_zero_init_states": "x",
    "replay_buffer_config.storage_unit": "episodes",
}


def _nested(key: str, value: Any) -> dict[str, Any]:
    """``{key: value}``, with ``parent.sub`` written as ``{parent: {sub: value}}``."""
    if "." in key:
        parent, sub = key.split(".", 1)
        return {parent: {sub: value}}
    return {key: value}


def _algorithm_with(canonical: str) -> str:
    """An algorithm that has ``canonical`` (apex first: it has the most keys)."""
    for name in ["apex", *algorithm_names()]:
        if canonical in config_fields(get_algorithm(name).config_cls):
            return name
    raise AssertionError(f"no algorithm has {canonical!r}")


def _load(algorithm: str, values: dict[str, Any]) -> dict[str, Any]:
    """The resolved config of ``values`` as plain data, with its RLlib-key warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return load_config(get_algorithm(algorithm).config_cls, values).to_dict()


def _warnings_of(algorithm: str, values: dict[str, Any]) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(get_algorithm(algorithm).config_cls, values).to_dict()
    return config, [str(w.message) for w in caught if w.category is RLlibKeyWarning]


# ---- the alias table -----------------------------------------------------------------------
FLAT_ALIASES = [a for a in ALIASES if not a.canonical.startswith("exploration_config.")]


@pytest.mark.parametrize("alias", FLAT_ALIASES, ids=lambda a: a.key)
def test_each_alias_sets_what_its_canonical_key_sets(alias):
    """Loading ``{alias: v}`` and ``{canonical: v}`` gives the same config, and not the
    default one (the alias really set something)."""
    assert alias.canonical in SAMPLES, f"give {alias.canonical!r} a value in SAMPLES"
    algorithm = _algorithm_with(alias.canonical)
    value = SAMPLES[alias.canonical]
    written = ALIAS_INPUT.get(alias.key, value)
    context = ALIAS_CONTEXT.get(alias.canonical, {})
    via_alias = _load(algorithm, {**context, **_nested(alias.key, written)})
    via_canonical = _load(algorithm, {**context, alias.canonical: value})
    assert via_alias == via_canonical
    assert via_alias != _load(algorithm, context)


def test_old_dqn_exploration_keys_set_exploration_config():
    """RLlib 0.6-0.8: epsilon falls to exploration_final_eps over exploration_fraction x
    schedule_max_timesteps steps (RLlib's defaults 0.1 and 100000 for the missing one)."""
    assert _load("apex", {"exploration_final_eps": 0.05}) == \
        _load("apex", {"exploration_config": {"final_epsilon": 0.05}})
    assert _load("apex", {"exploration_fraction": 0.2, "schedule_max_timesteps": 50_000}) == \
        _load("apex", {"exploration_config": {"epsilon_timesteps": 10_000}})
    assert _load("apex", {"schedule_max_timesteps": 2_000_000}) == \
        _load("apex", {"exploration_config": {"epsilon_timesteps": 200_000}})
    covered = {"exploration_final_eps", "exploration_fraction", "schedule_max_timesteps"}
    assert {a.key for a in ALIASES if a not in FLAT_ALIASES} == covered
    with pytest.raises(ConfigError, match="exploration_final_eps.*exploration_config"):
        _load("apex", {"exploration_final_eps": 0.05,
                       "exploration_config": {"final_epsilon": 0.1}})


@pytest.mark.parametrize("alias", [a for a in FLAT_ALIASES if "." not in a.key
                                   and not a.deprecated], ids=lambda a: a.key)
def test_an_alias_and_its_key_disagreeing_is_refused_naming_both(alias):
    algorithm = _algorithm_with(alias.canonical)
    value = SAMPLES[alias.canonical]
    other = (not value if isinstance(value, bool) else
             {k: [*v, 1] if isinstance(v, list) else v + 1 for k, v in value.items()}
             if isinstance(value, dict) else value + 1)
    context = ALIAS_CONTEXT.get(alias.canonical, {})
    with pytest.raises(ConfigError) as info:
        _load(algorithm, {**context, alias.key: value, alias.canonical: other})
    assert repr(alias.key) in str(info.value) and repr(alias.canonical) in str(info.value)
    assert _load(algorithm, {**context, alias.key: value, alias.canonical: value}) == \
        _load(algorithm, {**context, alias.canonical: value})


def test_two_aliases_of_one_key_disagreeing_are_refused():
    with pytest.raises(ConfigError, match="'num_rollout_workers' and 'num_env_runners'"):
        _load("impala", {"num_rollout_workers": 2, "num_env_runners": 3})


def test_an_alias_of_a_key_the_algorithm_lacks_names_the_alias():
    with pytest.raises(ConfigError) as info:
        _load("impala", {"replay_buffer_config": {"capacity": 1000}})
    message = str(info.value)
    assert "'replay_buffer_config.capacity'" in message and "'buffer_size'" in message
    assert "impala" in message


def test_replay_buffer_types():
    """Prioritized types set prioritized_replay: true, uniform ones false (a module path
    too); any other type is refused, naming it."""
    for buffer_type, prioritized in [("MultiAgentPrioritizedReplayBuffer", True),
                                     ("PrioritizedReplayBuffer", True),
                                     ("ray.rllib.utils.replay_buffers.ReplayBuffer", False),
                                     ("MultiAgentReplayBuffer", False)]:
        config = _load("apex", {"replay_buffer_config": {"type": buffer_type}})
        assert config["replay"]["prioritized_replay"] is prioritized
    with pytest.raises(ConfigError, match="'ReservoirReplayBuffer'"):
        _load("apex", {"replay_buffer_config": {"type": "ReservoirReplayBuffer"}})
    with pytest.raises(ConfigError, match="'replay_buffer_config.nonsense'"):
        _load("apex", {"replay_buffer_config": {"nonsense": 1}})
    with pytest.raises(ConfigError, match="'optimizer.nonsense'"):
        _load("apex", {"optimizer": {"nonsense": 1}})


# ---- accepted and ignored ------------------------------------------------------------------
IGNORED_KEYS = [i.key for i in IGNORED] + list(IGNORED_SUBKEYS)


@pytest.mark.parametrize("key", IGNORED_KEYS)
def test_each_ignored_key_warns_once_and_changes_nothing(key):
    assert key in IGNORED_OFF, f"give {key!r} an accepted value in IGNORED_OFF"
    config, messages = _warnings_of("apex", _nested(key, IGNORED_OFF[key]))
    assert config == _load("apex", {})
    assert len([m for m in messages if m.startswith(f"{key}:")]) == 1, messages
    assert len(messages) == 1 and "ignored" in messages[0]


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_values_that_would_change_learning_are_refused_naming_the_key(key):
    with pytest.raises(ConfigError) as info:
        _load("apex", _nested(key, REFUSED[key]))
    assert f"{key}:" in str(info.value) and "cannot be honoured" in str(info.value)


def test_framework_torch_is_silent_and_tf_says_torch_runs():
    assert _warnings_of("impala", {"framework": "torch"})[1] == []
    for framework in ("tf", "tf2", "tfe"):
        _, messages = _warnings_of("impala", {"framework": framework})
        assert messages == [f"framework: {framework} is ignored: actorrl runs torch; the "
                            "file's other settings apply unchanged"]


def test_final_prioritized_replay_beta():
    """Ape-X: ignored with a warning (RLlib's Ape-X kept beta constant); equal to the
    starting beta: ignored anywhere, with its annealing keys."""
    config, messages = _warnings_of("apex", {"final_prioritized_replay_beta": 1.0,
                                             "prioritized_replay_beta_annealing_timesteps":
                                                 20000})
    assert config == _load("apex", {})
    assert [m.split(":")[0] for m in messages] == [
        "final_prioritized_replay_beta", "prioritized_replay_beta_annealing_timesteps"]
    config, messages = _warnings_of("apex", {"final_prioritized_replay_beta": 0.5,
                                             "prioritized_replay_beta": 0.5})
    assert config == _load("apex", {"prioritized_replay_beta": 0.5}) and len(messages) == 1


async def test_dqn_anneals_beta_to_final_prioritized_replay_beta():
    """RLlib's DQN: beta moves linearly from prioritized_replay_beta to the final value over
    prioritized_replay_beta_annealing_timesteps rows trained (0.8: beta_annealing_fraction x
    schedule_max_timesteps); the replay shard samples with it."""
    import numpy as np

    from actorrl.data.batch import SampleBatch
    from actorrl.replay.actor import ReplayActor

    config = _load("dqn", {"final_prioritized_replay_beta": 1.0,
                           "prioritized_replay_beta_annealing_timesteps": 640})
    assert config["replay"]["final_prioritized_replay_beta"] == 1.0
    old = _load("dqn", {"final_prioritized_replay_beta": 1.0, "beta_annealing_fraction": 0.5,
                        "schedule_max_timesteps": 4000})
    assert old["replay"]["prioritized_replay_beta_annealing_timesteps"] == 2000
    shard = ReplayActor({**config["replay"], "learning_starts": 0}, seed=0)
    rows = SampleBatch({"obs": np.zeros((100, 2), np.float32),
                        "new_obs": np.zeros((100, 2), np.float32),
                        "actions": np.zeros(100, np.int64), "rewards": np.ones(100, np.float32),
                        "terminateds": np.zeros(100, bool)})
    shard.replay_buffers["default_policy"].add_batch(rows)
    shard.num_added = 100
    sampler = shard.replay_buffers["default_policy"].sampler
    betas = []
    for _ in range(25):  # 32-row batches: 800 rows, past the 640-row horizon
        await shard.replay()
        betas.append(sampler.beta)
    assert betas[0] == pytest.approx(0.4)
    assert betas[10] == pytest.approx(0.4 + 0.6 * 320 / 640)
    assert betas[-1] == pytest.approx(1.0) and betas == sorted(betas)


# ---- env-dependent keys ------------------------------------------------------------------------
def test_atari_frameskip_one_is_actorrls_default_and_others_are_refused():
    pytest.importorskip("ale_py")
    pong = {"env": "ALE/Pong-v5"}
    assert _load("impala", {**pong, "env_config": {"frameskip": 1}}) == _load("impala", pong)
    with pytest.raises(ConfigError) as info:
        _load("impala", {**pong, "env_config": {"frameskip": 4}})
    message = str(info.value)
    assert "env_config.frameskip: 4" in message and "frame_skip" in message
    assert "did you mean" not in message


def test_clip_rewards():
    """Atari ids: env_config.clip_rewards; elsewhere false/null accepted, true refused."""
    pytest.importorskip("ale_py")
    pong = {"env": "ALE/Pong-v5"}
    assert _load("impala", {**pong, "clip_rewards": False}) == \
        _load("impala", {**pong, "env_config": {"clip_rewards": False}})
    assert _load("impala", {**pong, "clip_rewards": None}) == _load("impala", pong)
    assert _load("impala", {**pong, "clip_rewards": True}) == _load("impala", pong)
    assert _load("impala", {"clip_rewards": False}) == _load("impala", {})
    with pytest.raises(ConfigError, match="clip_rewards: true cannot be honoured.*Atari"):
        _load("impala", {"clip_rewards": True})
    with pytest.raises(ConfigError, match="'clip_rewards' and 'env_config.clip_rewards'"):
        _load("impala", {**pong, "clip_rewards": True, "env_config": {"clip_rewards": False}})


# ---- suggestions and algorithm names ----------------------------------------------------------
def test_suggestions_never_propose_another_setting():
    with pytest.raises(ConfigError) as info:
        _load("impala", {"frameskip": 4})
    assert "did you mean" not in str(info.value)
    from actorrl.envs.atari import AtariOptions

    with pytest.raises(ValueError) as atari_info:
        AtariOptions.from_env_config({"frameskip": 4})
    assert "did you mean" not in str(atari_info.value)
    assert get_algorithm("APPO").name == "appo"
    with pytest.raises(ValueError) as algo_info:
        get_algorithm("DDPPO")
    assert "did you mean" not in str(algo_info.value).lower()


def test_stop_keys_under_rllib_result_paths():
    stop = StopCriteria.from_mapping({"env_runners/episode_return_mean": 150,
                                      "num_env_steps_sampled_lifetime": 1000,
                                      "training_iteration": 5})
    assert stop.thresholds == {"episode_reward_mean": 150.0, "timesteps_total": 1000.0,
                               "training_iteration": 5.0}
    for key, target in STOP_ALIASES.items():
        assert StopCriteria.from_mapping({key.replace(".", "/"): 1}).thresholds == {target: 1}
    with pytest.raises(ValueError, match="sampler_results/episode_reward_mean"):
        StopCriteria.from_mapping({"episode_reward_mean": 100,
                                   "sampler_results/episode_reward_mean": 150})


# ---- RLlib-layout files --------------------------------------------------------------------
RLLIB_2X_APEX = """\
cartpole-apex-dqn:
    env: CartPole-v1
    run: APEX
    stop:
        sampler_results/episode_reward_mean: 150.0
        timesteps_total: 250000
    config:
        framework: tf
        num_rollout_workers: 1
        optimizer:
          num_replay_buffer_shards: 2
        replay_buffer_config:
          type: MultiAgentPrioritizedReplayBuffer
          capacity: 20000
          min_size_for_sampling: 1000
        num_gpus: 0
        num_gpus_per_worker: 0
        min_time_s_per_iteration: 5
        target_network_update_freq: 500
        min_sample_timesteps_per_iteration: 1000
        num_steps_sampled_before_learning_starts: 500
        training_intensity: 4
        noisy: false
        num_atoms: 1
"""
RLLIB_NEW_STACK_IMPALA = """\
cartpole-impala:
    env: CartPole-v1
    run: IMPALA
    stop:
        env_runners/episode_return_mean: 450
        training_iteration: 2
    config:
        framework: torch
        enable_rl_module_and_learner: false
        enable_env_runner_and_connector_v2: false
        num_env_runners: 1
        num_envs_per_env_runner: 2
        num_learners: 0
        vtrace_drop_last_ts: false
        replay_ratio: 0.0
        min_time_s_per_iteration: 0
        min_sample_timesteps_per_iteration: 400
"""


def test_rllib_2x_files_load(tmp_path):
    path = tmp_path / "apex.yaml"
    path.write_text(RLLIB_2X_APEX)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        plan = plan_training(None, config_file=str(path))
    config = plan.config
    assert plan.spec.name == "apex"
    assert (config.num_workers, config.replay.num_replay_buffer_shards,
            config.replay.buffer_size, config.replay.prioritized_replay,
            config.replay.learning_starts, config.min_iter_time_s,
            config.timesteps_per_iteration) == (1, 2, 20000, True, 500, 5.0, 1000)
    assert plan.stop.thresholds == {"episode_reward_mean": 150.0, "timesteps_total": 250000}
    file = read_config_file_sections(str(path))
    assert file.algorithm == "APEX"


def test_set_overrides_a_files_alias(tmp_path):
    """A later layer's key overrides an earlier layer's alias of it (no conflict)."""
    path = tmp_path / "impala.yaml"
    path.write_text("run: IMPALA\nnum_env_runners: 2\n")
    plan = plan_training(None, config_file=str(path), overrides=["num_workers=1"])
    assert plan.config.num_workers == 1
    plan = plan_training(None, config_file=str(path), overrides=["num_rollout_workers=3"])
    assert plan.config.num_workers == 3
    path.write_text("run: IMPALA\nnum_env_runners: 2\nnum_workers: 1\n")
    with pytest.raises(UsageError, match="'num_workers' and 'num_env_runners'"):
        plan_training(None, config_file=str(path))


def test_a_new_stack_rllib_file_trains_through_the_cli(tmp_path):
    """RLlib 2.10+ names and switches: two iterations, one warning line per ignored key."""
    path = tmp_path / "impala.yaml"
    path.write_text(RLLIB_NEW_STACK_IMPALA)
    out = tmp_path / "results"
    proc = run_cli(["train", "--config", str(path), "--output", str(out),
                    "--stop-timesteps", "4000", "--stop-time", "120", "--progress", "plain"],
                   tmp_path, timeout_s=240)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "warning:" in line]
    for key in ("enable_rl_module_and_learner", "enable_env_runner_and_connector_v2",
                "num_learners", "vtrace_drop_last_ts", "replay_ratio"):
        assert len([w for w in warned if f"warning: {key}:" in w]) == 1, proc.stderr
    assert not [w for w in warned if "framework" in w]
    (run,) = run_dirs(out)
    config = json.loads((run / "config.json").read_text())
    assert config["num_workers"] == 1 and config["rollout"]["num_envs_per_worker"] == 2
    results = read_jsonl(run / "result.jsonl")
    assert 1 <= len(results) <= 2 and (results[-1]["training_iteration"] == 2
                                       or results[-1]["timesteps_total"] >= 4000)


def test_more_workers_than_cores_starts_with_a_warning(tmp_path):
    """4 x cores workers on CartPole: one iteration, and a warning naming the cores and
    the request (the local node places every actor; nothing waits for free CPUs)."""
    cores = os.cpu_count() or 1
    workers = 4 * cores
    out = tmp_path / "results"
    proc = run_cli(["train", "a2c", "--output", str(out), "--num-workers", str(workers),
                    "--set", "min_iter_time_s=0", "--set", "num_envs_per_worker=1",
                    "--stop-timesteps", "1", "--stop-time", "120", "--progress", "plain"],
                   tmp_path, timeout_s=300)
    assert proc.returncode == 0, proc.stderr
    assert f"num_workers={workers}" in proc.stderr and f"{cores} cores" in proc.stderr
    assert f"--set num_workers={cores}" in proc.stderr
    (run,) = run_dirs(out)
    assert read_jsonl(run / "result.jsonl")[-1]["training_iteration"] >= 1


@pytest.mark.parametrize("num_gpus", [1, 0.5, 2])
def test_a_gpu_file_runs_its_learner_on_the_cpu_of_a_machine_without_gpus(num_gpus):
    from actorrl.experiment.train import without_missing_gpus

    plan = plan_training("impala", overrides=[f"num_gpus={num_gpus}"], stop_time_s=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu = without_missing_gpus(plan, gpus=0)
        assert without_missing_gpus(plan, gpus=1) is plan  # the learner names what it lacks
    config = cpu.config.to_dict()
    assert config["num_gpus"] == 0 and plan.config.num_gpus == num_gpus
    assert {k: v for k, v in config.items() if k != "num_gpus"} == \
        {k: v for k, v in plan.config.to_dict().items() if k != "num_gpus"}
    [warning] = [w for w in caught if w.category is RLlibKeyWarning]
    assert f"num_gpus: {num_gpus:g} asks for CUDA GPUs" in str(warning.message)
    assert "--set num_gpus=0" in str(warning.message)
    assert without_missing_gpus(cpu, gpus=0) is cpu


def test_oversubscription_warning_text():
    from actorrl.experiment.train import oversubscription_warning

    config = load_config(get_algorithm("impala").config_cls, {"num_workers": 8})
    assert oversubscription_warning(config, cores=8) is None
    text = oversubscription_warning(config, cores=2)
    assert text is not None and "num_workers=8" in text and "2 cores" in text
    assert "--set num_workers=2" in text


@pytest.mark.parametrize("algorithm, values, length", [
    ("a2c", {"train_batch_size": 2000, "num_workers": 4, "num_envs_per_worker": 3}, 167),
    ("ppo", {"train_batch_size": 4000, "num_workers": 2, "num_envs_per_worker": 1}, 2000),
    ("ppo", {"train_batch_size": 500, "num_workers": 0, "num_envs_per_worker": 5}, 100),
    ("impala", {"train_batch_size": 500, "num_workers": 2, "num_envs_per_worker": 5}, 50),
    ("dqn", {"n_step": 3}, 4)])
def test_rollout_fragment_length_auto(algorithm, values, length):
    """RLlib 2.x's 'auto': the train batch over every worker's envs (rounded up); DQN's
    4."""
    config = _load(algorithm, {"rollout_fragment_length": "auto", **values})
    assert config["rollout"]["rollout_fragment_length"] == length


def test_rllib_learners_are_towers_and_exploration_types_are_named():
    config, warned = _warnings_of("appo", {"num_learner_workers": 4,
                                           "num_gpus_per_learner_worker": 1, "num_gpus": 0})
    assert (config["num_gpus"], config["_fake_gpus"]) == (4, False)
    assert len(warned) == 1 and "actorrl's 4 learner towers" in warned[0]
    config, _ = _warnings_of("ppo", {"num_learners": 2})
    assert (config["num_gpus"], config["_fake_gpus"]) == (2, True)
    with pytest.raises(ConfigError, match="num_gpus: 1 and num_learners: 2 disagree"):
        _load("ppo", {"num_learners": 2, "num_gpus": 1})
    config, warned = _warnings_of("appo", {"exploration_config": {"type": "StochasticSampling"}})
    assert config == _load("appo", {}) and warned[0].startswith("exploration_config:")
    with pytest.raises(ConfigError, match="exploration_config: .*cannot be honoured"):
        _load("ppo", {"exploration_config": {"type": "GaussianNoise"}})
    with pytest.raises(ConfigError, match="'ParameterNoise' cannot be honoured: actorrl's dqn "
                                          "policy explores epsilon-greedily"):
        _load("dqn", {"exploration_config": {"type": "ParameterNoise", "random_timesteps": 1}})
    shared = _load("ppo", {"vf_share_layers": True})
    assert shared["policy"]["model"]["vf_share_layers"] is True
    assert shared == _load("ppo", {"model": {"vf_share_layers": True}})
    with pytest.raises(ConfigError, match="'vf_share_layers' and 'model.vf_share_layers'"):
        _load("ppo", {"vf_share_layers": True, "model": {"vf_share_layers": False}})


def test_tune_experiment_keys_are_accepted_with_a_warning(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("cartpole-impala:\n  env: CartPole-v1\n  run: IMPALA\n"
                    "  checkpoint_freq: 5\n  checkpoint_at_end: true\n  local_dir: /x\n"
                    "  config: {num_workers: 1}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        file = read_config_file_sections(str(path))
    assert file.values == {"env": "CartPole-v1", "num_workers": 1}
    assert sorted(str(w.message).split(":")[0] for w in caught
                  if w.category is RLlibKeyWarning) == [
        "checkpoint_at_end", "checkpoint_freq", "local_dir"]


def test_release_learning_test_keys_are_accepted_with_a_warning(tmp_path):
    """RLlib's release learning tests put pass_criteria and frameworks beside run/config
    (a3c-pongdeterministic-v5.yaml was refused for frameworks)."""
    path = tmp_path / "release.yaml"
    path.write_text("a3c-pong:\n  env: CartPole-v1\n  run: A3C\n"
                    "  pass_criteria: {episode_reward_mean: 18.0, timesteps_total: 5000000}\n"
                    "  stop: {time_total_s: 3600}\n  frameworks: [tf]\n"
                    "  config: {num_workers: 1}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        file = read_config_file_sections(str(path))
    assert file.values == {"env": "CartPole-v1", "num_workers": 1}
    assert file.stop == {"time_total_s": 3600}
    assert sorted(str(w.message).split(":")[0] for w in caught
                  if w.category is RLlibKeyWarning) == ["frameworks", "pass_criteria"]


def test_horizon_cuts_single_agent_episodes():
    from actorrl.rollout import RolloutWorker

    worker = RolloutWorker("CartPole-v1", get_algorithm("a2c").policy, {
        "horizon": 7, "rollout_fragment_length": 50, "seed": 0})
    batch = worker.sample()
    lengths = worker.get_metrics().episode_lengths
    assert lengths and max(lengths) == 7 and batch["truncateds"].sum() >= len(lengths)
    with pytest.raises(ConfigError, match="horizon must be an int >= 1 or null, got 0"):
        _load("a2c", {"horizon": 0})


def test_rllib_example_envs():
    from actorrl.envs import make_env

    env = make_env("ray.rllib.examples.env.random_env.RandomLargeObsSpaceEnv".replace(
        "ray.rllib.examples.env.random_env.", "actorrl.envs.custom.rllib_examples:"),
        {"p_done": 0.5})
    obs, _ = env.reset(seed=0)
    assert obs.shape == (5000,) and env.action_space.n == 2
    ends = sum(env.step(0)[2] for _ in range(400))
    assert 120 < ends < 280  # p_done 0.5 (RLlib's older name of p_terminated)
    repeat = make_env("actorrl.envs.custom.rllib_examples:RepeatAfterMeEnv", {"repeat_delay": 2})
    seen = [repeat.reset(seed=1)[0]]
    rewards, truncated = [], False
    while not truncated:
        target = ([0, 0] + seen)[-3]
        obs, reward, _, truncated, _ = repeat.step(target)
        rewards.append(reward)
        seen.append(obs)
    assert rewards == [1.0] * 99  # repeated every time; cut after RLlib's 100-token history
    assert repeat.step(1 - ([0, 0] + seen)[-3])[1] == -1.0


def test_aliases_and_ignored_keys_inside_evaluation_config():
    config, warned = _warnings_of("impala", {"evaluation_interval": 1, "evaluation_config": {
        "num_envs_per_env_runner": 3, "framework": "tf2", "explore": False}})
    assert config["evaluation_config"] == {"num_envs_per_worker": 3, "explore": False}
    assert len(warned) == 1 and warned[0].startswith("framework: tf2 is ignored")
    with pytest.raises(ConfigError, match="evaluation_config: num_atoms: 51 cannot be"):
        _load("impala", {"evaluation_config": {"num_atoms": 51}})


def test_rllib_example_classes_and_multiagent_forms():
    """RLlib's MultiAgentCartPole and example mapping class read as actorrl's equals; a
    list of policy ids is policies with default specs; another {type: class} is refused."""
    from actorrl.config.aliases import RLLIB_CLASSES, resolve_rllib_keys
    from actorrl.envs.custom.multi_agent import MultiAgentCartPole, policy_p_agent_id

    resolved = resolve_rllib_keys({
        "env": "ray.rllib.examples.env.multi_agent.MultiAgentCartPole",
        "multiagent": {"policies": ["p0", "p1"], "policy_mapping_fn": {
            "type": "ray.rllib.examples.multi_agent_and_self_play.policy_mapping_fn."
                    "PolicyMappingFn"}}})
    assert resolved.problems == []
    assert resolved.values["env"] == "actorrl.envs.custom.multi_agent:MultiAgentCartPole"
    multiagent = resolved.values["multiagent"]
    assert multiagent["policies"] == {"p0": [None, None, None, {}],
                                      "p1": [None, None, None, {}]}
    assert multiagent["policy_mapping_fn"] == "actorrl.envs.custom.multi_agent:policy_p_agent_id"
    assert resolve_rllib_keys({"env": "ray.rllib.examples.envs.classes.multi_agent."
                                      "MultiAgentCartPole"}).values["env"] == \
        RLLIB_CLASSES["ray.rllib.examples.env.multi_agent.MultiAgentCartPole"]
    refused = resolve_rllib_keys({"multiagent": {"policy_mapping_fn": {"type": "my.Fn"}}})
    assert len(refused.problems) == 1 and "'pkg.module:fn'" in refused.problems[0]
    env = MultiAgentCartPole({"num_agents": 3})
    obs, _ = env.reset(seed=0)
    assert sorted(obs) == [0, 1, 2] and [policy_p_agent_id(a) for a in obs] == ["p0", "p1", "p2"]
    assert MultiAgentCartPole({}).possible_agents == [0]  # RLlib's default: one agent
    with pytest.raises(ValueError, match="num_agents must be an integer >= 1, got 0"):
        MultiAgentCartPole({"num_agents": 0})


def test_readme_lists_the_aliases():
    # The aliases table lives in the docs' generated config reference.
    text = Path(__file__).resolve().parent.parent.joinpath("docs", "configuration.md").read_text()
    for alias in ALIASES:
        assert f"`{alias.key}`" in text, alias.key
