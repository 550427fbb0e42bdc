"""The pieces behind ``actorrl train``, in-process and fast: checkpoint files (round trip,
atomic folders, corrupt files refused), result writers (JSONL, CSV with late keys,
TensorBoard), stop criteria and one-line error summaries."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

import actorrl
from actorrl.algorithms import checkpoints as ckpt
from actorrl.algorithms.stop import StopCriteria, default_stop_reward
from actorrl.experiment.errors import error_summary
from actorrl.experiment.results import (
    ResultWriter,
    RunDirectory,
    derived_metrics,
    flatten_result,
    read_results,
)
from actorrl.runtime.errors import ActorCreationError
from transport.errors import RemoteError


def _state(iteration: int = 3) -> dict:
    rng = np.random.default_rng(0)
    return {
        "algorithm": "apex",
        "config": {"env": "CartPole-v1", "lr": 0.001, "model": {"fcnet_hiddens": [64]}},
        "policies": {"default_policy": {
            "weights": {"w": rng.normal(size=(300, 200)).astype(np.float32),
                        "b": np.arange(3, dtype=np.float64)},
            "optimizer": {"state": {0: {"step": np.array(5.0),
                                        "exp_avg": np.ones((2, 2), np.float32)}},
                          "param_groups": [{"lr": 0.001, "params": [0]}]},
            "global_timestep": 1234, "num_updates": 7}},
        "iteration": iteration, "time_total_s": 1.5, "timesteps_total": 4096,
        "num_steps_trained": 2048,
    }


def test_checkpoint_round_trip_keeps_arrays_and_nested_state(tmp_path: Path) -> None:
    """What write_checkpoint stores, read_checkpoint returns: same arrays (dtype, shape,
    values, writable), int dict keys, scalars and metadata."""
    state = _state()
    folder = ckpt.write_checkpoint(tmp_path, state, {"env": "CartPole-v1"})
    assert folder == tmp_path / "checkpoint_000003"
    found, loaded = ckpt.read_checkpoint(folder)
    assert found == folder
    policy, original = loaded["policies"]["default_policy"], state["policies"]["default_policy"]
    for name, array in original["weights"].items():
        assert policy["weights"][name].dtype == array.dtype
        np.testing.assert_array_equal(policy["weights"][name], array)
        assert policy["weights"][name].flags.writeable
    assert policy["optimizer"]["state"][0]["step"] == 5.0
    assert policy["optimizer"]["param_groups"] == [{"lr": 0.001, "params": [0]}]
    assert loaded["timesteps_total"] == 4096 and loaded["config"]["model"]["fcnet_hiddens"] == [64]
    metadata = json.loads((folder / ckpt.METADATA_FILE).read_text())
    assert metadata["env"] == "CartPole-v1"
    assert metadata["format_version"] == loaded["format_version"] == ckpt.FORMAT_VERSION
    assert metadata["actorrl_version"] == loaded["actorrl_version"] == actorrl.__version__
    assert "migrated_from_format" not in loaded


def test_latest_complete_checkpoint_is_found_and_temp_folders_ignored(tmp_path: Path) -> None:
    """find_checkpoint resolves a results folder to its newest complete checkpoint; a
    half-written temporary folder never counts."""
    run = tmp_path / "run"
    for iteration in (2, 10, 9):
        ckpt.write_checkpoint(run / "checkpoints", _state(iteration), {})
    half = run / "checkpoints" / ".checkpoint_000011.tmp-99"
    half.mkdir()
    (half / ckpt.STATE_FILE).write_bytes(b"ACTORRL\x00partial")
    assert ckpt.find_checkpoint(run).name == "checkpoint_000010"
    assert ckpt.find_checkpoint(run / "checkpoints").name == "checkpoint_000010"
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == [
        "checkpoint_000002", "checkpoint_000009", "checkpoint_000010"]


def test_failed_write_leaves_no_checkpoint_behind(tmp_path: Path, monkeypatch) -> None:
    """If writing fails midway, neither a checkpoint folder nor a temp folder remains."""
    def broken(state: dict) -> list:
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "encode_state_file", broken)
    with pytest.raises(OSError, match="disk full"):
        ckpt.write_checkpoint(tmp_path, _state(), {})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda data: data[: len(data) // 2], "truncated"),
    (lambda data: b"NOTACKPT" + data[8:], "bad magic"),
    (lambda data: data[:5], "too short"),
])
def test_corrupt_state_files_are_refused(tmp_path: Path, mutate, message: str) -> None:
    """Truncated or foreign files raise CheckpointError naming the problem, never garbage."""
    folder = ckpt.write_checkpoint(tmp_path, _state(), {})
    path = folder / ckpt.STATE_FILE
    path.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.read_checkpoint(folder)


def test_missing_checkpoint_is_a_checkpoint_error(tmp_path: Path) -> None:
    """Nonexistent paths and folders without checkpoints are named in the error."""
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.find_checkpoint(tmp_path / "nope")
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint in"):
        ckpt.find_checkpoint(tmp_path)


def _result(iteration: int, **extra) -> dict:
    return {"episode_reward_mean": 10.0 * iteration, "episode_reward_min": 1.0,
            "episode_reward_max": 30.0, "episode_len_mean": 10.0, "episodes_this_iter": 2,
            "timesteps_total": 100 * iteration, "timesteps_this_iter": 100,
            "num_steps_trained": 50 * iteration, "training_iteration": iteration,
            "time_this_iter_s": 0.5, "time_total_s": 0.5 * iteration,
            "num_healthy_workers": 1, "timestamp": 1.0, "info": {"a": 1, **extra}}


def test_result_writer_widens_the_csv_when_keys_appear_late(tmp_path: Path) -> None:
    """A key that shows up in iteration 2 (learner stats start late) becomes a column;
    iteration 1's row keeps its values and leaves the new column empty. JSONL holds
    strict JSON (NaN as null)."""
    run = RunDirectory.create(tmp_path, "apex", "CartPole-v1")
    writer = ResultWriter(run.path, tensorboard=False)
    first = _result(1)
    first["episode_reward_mean"] = math.nan
    writer.record(first)
    writer.record(_result(2, learner={"default_policy": {"loss": 0.5}},
                          quantiles=np.array([1.0, 2.0])))
    writer.close()
    with open(run.path / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert rows[0]["info/learner/default_policy/loss"] == ""
    assert rows[1]["info/learner/default_policy/loss"] == "0.5"
    assert rows[1]["info/quantiles"] == "[1.0, 2.0]"
    assert rows[0]["timesteps_total"] == "100" and rows[0]["episode_reward_mean"] == "nan"
    results = read_results(run.path)
    assert results[0]["episode_reward_mean"] is None
    assert results[1]["info"]["learner"]["default_policy"]["loss"] == 0.5
    assert "NaN" not in (run.path / "result.jsonl").read_text()


def test_run_directory_names_are_unique_and_status_is_atomic(tmp_path: Path) -> None:
    """Two runs in the same second get distinct folders; run.json merges updates."""
    import datetime

    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    a = RunDirectory.create(tmp_path, "apex", "pkg.mod:make/env", when)
    b = RunDirectory.create(tmp_path, "apex", "pkg.mod:make/env", when)
    assert a.path.name == "apex_pkg.mod_make_env_2024-05-06_07-08-09"
    assert b.path.name == a.path.name + "_2"
    a.update_status(status="running", pid=1)
    a.update_status(status="finished")
    status = json.loads((a.path / "run.json").read_text())
    assert status["status"] == "finished" and status["pid"] == 1
    assert not [p for p in a.path.iterdir() if p.name.startswith(".")]


def test_flatten_and_derived_metrics() -> None:
    """Nested keys join with '/'; rates come from consecutive results."""
    flat = flatten_result({"a": {"b": {"c": 1}}, "d": [1, 2], "e": np.float32(2.5)})
    assert flat == {"a/b/c": 1, "d": "[1, 2]", "e": 2.5}
    derived = derived_metrics(_result(2, learner_queue={"size_mean": 3.0}), _result(1))
    assert derived == {"env_steps_per_s": 200.0, "trained_steps_per_s": 100.0,
                       "learner_queue_size": 3.0}
    assert "trained_steps_per_s" not in derived_metrics(_result(1), None)


def test_stop_criteria() -> None:
    """Each criterion stops with a reason; a NaN reward (no episode yet) never does."""
    stop = StopCriteria.of(reward=450.0, timesteps=1000, time_s=60.0)
    assert stop.reached({"episode_reward_mean": math.nan, "timesteps_total": 10}, 1.0) is None
    assert "episode_reward_mean" in stop.reached({"episode_reward_mean": 451.0,
                                                  "timesteps_total": 10}, 1.0)
    assert "timesteps_total" in stop.reached({"timesteps_total": 1000}, 1.0)
    assert "trained for" in stop.reached({"timesteps_total": 10}, 60.0)
    assert StopCriteria().reached({"timesteps_total": 10**9}, 10**9) is None
    assert stop.fraction({"timesteps_total": 500, "episode_reward_mean": 45.0}, 6.0) == 0.5
    assert stop.eta_s({"timesteps_total": 500}, 6.0, env_steps_per_s=100.0) == 5.0
    assert StopCriteria().eta_s(None, 5.0, 100.0) is None
    assert default_stop_reward("CartPole-v1") == 450.0
    assert default_stop_reward("Pendulum-v1") is None


def test_error_summary_is_one_line() -> None:
    """Remote tracebacks and log tails are cut; the type is named for plain exceptions."""
    remote = RemoteError("ValueError", "bad value", "Traceback (most recent call last):\n  x")
    assert error_summary(remote) == "ValueError: bad value"
    creation = ActorCreationError(f"constructing a.b:C failed: {remote}")
    assert error_summary(creation) == "constructing a.b:C failed: ValueError: bad value"
    died = ActorCreationError("actor a.b:C exited with code 1 while starting",
                              log_path="/x/y.log", log_tail="Traceback ...")
    assert str(died) == ("actor a.b:C exited with code 1 while starting; its log "
                         "(/x/y.log) ends with:\nTraceback ...")
    assert error_summary(died) == "actor a.b:C exited with code 1 while starting"
    from actorrl.config.sections import ConfigError

    listed = ConfigError("invalid PPOLearnerConfig:", problems=["a is bad", "b is worse"])
    assert error_summary(listed) == "invalid PPOLearnerConfig: a is bad; b is worse"
    assert error_summary(OSError("no space")) == "OSError: no space"
    assert error_summary(KeyError()) == "KeyError"


def test_a_config_file_section_merges_over_a_checkpoints(tmp_path) -> None:
    """A file's ``policy: {lr: ...}`` over a restored checkpoint's config changes that key
    and keeps the checkpoint's other policy keys (it used to reset them to defaults)."""
    from actorrl.algorithms import get_algorithm
    from actorrl.experiment.train import resolve_config

    spec = get_algorithm("apex")
    restored = resolve_config(spec, overrides=["gamma=0.5", "lr=0.1"]).to_dict()
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  lr: 0.2\n")
    config = resolve_config(spec, base=restored, config_file=str(path))
    assert config.lr == 0.2 and config.gamma == 0.5


# ---- plot: learning-curve CSVs -------------------------------------------------------------
CURVE_CSV = ("env_steps,seconds,episode_reward_mean,episode_reward_min,episode_reward_max,"
             "episodes_total,entropy\n300,4.0,,,,0,\n1000,7.8,-20.5,-21.0,-19.0,3,1.7\n"
             "5000,30.0,-18.0,-21.0,-12.0,9,1.6\n")


def test_plot_reads_benchmark_learning_csvs(tmp_path: Path) -> None:
    """``actorrl plot`` overlays the curves benchmarks/learning.py publishes: blank
    returns read as NaN, the file name is the label; a CSV without the columns is refused
    naming them."""
    from actorrl.experiment.errors import UsageError
    from actorrl.experiment.plot import load_csv_curve, plot_runs

    first, second = tmp_path / "appo-Pong.csv", tmp_path / "ppo-Pong.csv"
    first.write_text(CURVE_CSV)
    second.write_text(CURVE_CSV.replace("-18.0", "-15.0"))
    curve = load_csv_curve(first)
    assert curve.label == "appo-Pong" and curve.timesteps == [300, 1000, 5000]
    assert math.isnan(curve.reward_mean[0]) and curve.reward_mean[1:] == [-20.5, -18.0]
    assert curve.time_s == [4.0, 7.8, 30.0] and curve.reward_max[2] == -12.0
    out = plot_runs([str(first), str(second)], tmp_path / "both.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "other.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="needs the columns env_steps, episode_reward_mean"):
        plot_runs([str(bad)], tmp_path / "bad.png")
