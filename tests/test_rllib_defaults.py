"""A config file in RLlib's layout (``run: ALGO``) starts from RLlib's defaults: the keys
it leaves out take RLlib's values, not actorrl's CartPole-tuned ones
(``actorrl.algorithms.tuned.RLLIB_DEFAULTS``), while actorrl's own files (``algorithm:``),
the command line and a restored checkpoint keep actorrl's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from actorrl.algorithms import get_algorithm
from actorrl.algorithms.tuned import CARTPOLE_TUNED, RLLIB_DEFAULTS
from actorrl.config.algorithm import load_config
from actorrl.experiment.train import (
    choose_algorithm,
    read_config_file_sections,
    resolve_config,
)
from actorrl.policy.model_config import MODEL_DEFAULTS

pytestmark = pytest.mark.unit


def _leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every leaf of a nested mapping (``model`` keys included)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _resolve(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "file.yaml"
    path.write_text(yaml.safe_dump(data))
    file = read_config_file_sections(str(path))
    return resolve_config(choose_algorithm(None, file), config_file=file)


def _value(config: Any, dotted: str) -> Any:
    current = config.to_dict(include_derived=False)
    for part in dotted.split("."):
        current = current[part]
    return current


@pytest.mark.parametrize("algorithm", sorted(CARTPOLE_TUNED))
def test_every_tuned_value_has_rllibs_value_beside_it(algorithm):
    """A value tuned for CartPole cannot leak into RLlib's files: RLLIB_DEFAULTS names
    RLlib's value of each key tuned."""
    tuned = _leaves(CARTPOLE_TUNED[algorithm])
    rllib = _leaves(RLLIB_DEFAULTS[algorithm])
    missing = sorted(set(tuned) - set(rllib))
    assert not missing, f"{algorithm}: tuned keys without RLlib's value: {missing}"


@pytest.mark.parametrize("algorithm", sorted(CARTPOLE_TUNED))
def test_an_rllib_file_that_sets_nothing_runs_with_rllibs_values(tmp_path, algorithm):
    name = get_algorithm(algorithm).name.upper()
    config = _resolve(tmp_path, {"exp": {"run": name, "env": "CartPole-v1", "config": {}}})
    for dotted, value in _leaves(RLLIB_DEFAULTS[algorithm]).items():
        if dotted.startswith("policy.model."):
            # The model a policy builds: the config's keys over the model defaults.
            model = {**MODEL_DEFAULTS, **_value(config, "policy.model")}
            assert model[dotted.rsplit(".", 1)[1]] == value, f"{algorithm} {dotted}"
        else:
            assert _value(config, dotted) == value, f"{algorithm} {dotted}"


def test_actorrls_own_files_keep_the_tuned_values(tmp_path):
    config = _resolve(tmp_path, {"algorithm": "ppo", "env": "CartPole-v1"})
    assert config.policy.lr == CARTPOLE_TUNED["ppo"]["policy"]["lr"]
    assert config.learner.num_sgd_iter == CARTPOLE_TUNED["ppo"]["learner"]["num_sgd_iter"]
    rllib = _resolve(tmp_path, {"run": "PPO", "env": "CartPole-v1"})
    assert (rllib.policy.lr, rllib.learner.num_sgd_iter, rllib.train_batch_size) == \
        (5e-5, 30, 4000)


def test_what_an_rllib_file_sets_wins_over_rllibs_defaults(tmp_path):
    config = _resolve(tmp_path, {"run": "A2C", "env": "CartPole-v1", "config": {
        "lr": 0.01, "microbatch_size": 50, "train_batch_size": 100,
        "model": {"fcnet_hiddens": [32]}}})
    assert (config.policy.lr, config.microbatch_size, config.train_batch_size) == \
        (0.01, 50, 100)
    assert config.policy.model["fcnet_hiddens"] == [32]
    assert config.policy.grad_clip == 40.0  # RLlib's A2C, not the tuned 0.5
    assert config.rollout.rollout_fragment_length == 20


def test_apex_exploration_keys_merge_into_per_worker_epsilons(tmp_path):
    """RLlib merges a file's exploration_config into Ape-X's PerWorkerEpsilonGreedy unless
    the file names another type."""
    config = _resolve(tmp_path, {"run": "APEX", "env": "CartPole-v1", "config": {
        "exploration_config": {"epsilon_timesteps": 2000}}})
    assert config.policy.exploration_config.type == "PerWorkerEpsilonGreedy"
    assert config.policy.exploration_config.epsilon_timesteps == 2000
    other = _resolve(tmp_path, {"run": "APEX", "env": "CartPole-v1", "config": {
        "exploration_config": {"type": "EpsilonGreedy", "final_epsilon": 0.1}}})
    assert other.policy.exploration_config.type == "EpsilonGreedy"
    assert other.policy.exploration_config.final_epsilon == 0.1
    assert other.replay.learning_starts == 50000


def test_a_restored_checkpoints_config_is_not_reset_to_rllibs(tmp_path):
    path = tmp_path / "file.yaml"
    path.write_text(yaml.safe_dump({"run": "PPO", "env": "CartPole-v1",
                                    "config": {"gamma": 0.95}}))
    file = read_config_file_sections(str(path))
    spec = choose_algorithm(None, file)
    base = {"policy": {"lr": 0.002}, "learner": {"num_sgd_iter": 4}}
    config = resolve_config(spec, base=base, config_file=file)
    assert (config.policy.lr, config.learner.num_sgd_iter, config.policy.gamma) == \
        (0.002, 4, 0.95)


@pytest.mark.parametrize(("count", "reported"), [(1, 1), (2, 1), (3, 1), (4, 2), (32, 11)])
def test_per_worker_exploration_reports_the_last_third_of_the_workers(count, reported):
    """With Ape-X's per-worker epsilons, results report the episodes of the workers that
    explore least (the last third by index), as RLlib's Ape-X does; otherwise all."""
    from types import SimpleNamespace

    from actorrl.algorithms.trainer import Trainer

    workers = [f"worker-{i}" for i in range(1, count + 1)]
    per_worker = load_config(get_algorithm("apex").config_cls, {
        "num_workers": count, "exploration_config": {"type": "PerWorkerEpsilonGreedy"}})
    trainer = SimpleNamespace(config=per_worker, workers=workers)
    assert Trainer._reporting_workers(trainer) == workers[count - reported:]
    plain = SimpleNamespace(config=per_worker.replace(exploration_config={
        "type": "EpsilonGreedy"}), workers=workers)
    assert Trainer._reporting_workers(plain) == workers


@pytest.mark.parametrize("run", ["DQN", "APEX"])
@pytest.mark.parametrize("model", [None, {"fcnet_hiddens": [64]}])
def test_rllib_q_files_take_rllibs_vision_net_even_beside_their_own_model(tmp_path, run,
                                                                          model):
    """RLlib's DQN and Ape-X files get RLlib's vision net (``vision_net: rllib``), also
    when they set ``model`` keys of their own (which replace the rest of the default
    model); actorrl's files and the other algorithms' RLlib files keep actorrl's."""
    config = {"env": "CartPole-v1"} if model is None else {"env": "CartPole-v1",
                                                            "model": model}
    rllib = _resolve(tmp_path, {"exp": {"run": run, "config": config}})
    assert _value(rllib, "policy.model")["vision_net"] == "rllib"
    if model is not None:
        assert _value(rllib, "policy.model")["fcnet_hiddens"] == [64]
    own = _resolve(tmp_path, {"algorithm": run.lower(), "env": "CartPole-v1"})
    assert _value(own, "policy.model").get("vision_net", "actorrl") == "actorrl"
    impala = _resolve(tmp_path, {"exp": {"run": "IMPALA", "config": config}})
    assert _value(impala, "policy.model").get("vision_net", "actorrl") == "actorrl"
    chosen = _resolve(tmp_path, {"exp": {"run": run, "config": {
        **config, "model": {**(model or {}), "vision_net": "actorrl"}}}})
    assert _value(chosen, "policy.model")["vision_net"] == "actorrl"
