"""Trackers: ``actorrl train --wandb/--mlflow`` (and ``logger_config`` in files) log every
result, the config and the checkpoints; read back from what each library wrote, with no
network (W&B's offline run folder, MLflow's local file store through mlflow's own client).
Settings are checked before anything starts; a missing extra names the pip command."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from actorrl.experiment.errors import UsageError
from actorrl.experiment.trackers import (
    TrackerSet,
    result_metrics,
    tracker_settings,
)
from actorrl.experiment.train import config_file_sections
from tests.helpers.cluster import (
    assert_no_process_left,
    cli_env,
    read_jsonl,
    run_dirs,
)
from tests.helpers.extras import installed

RUN_TIMEOUT_S = 240.0
TINY = ["--env", "CartPole-v1", "--num-workers", "1", "--set", "train_batch_size=400",
        "--stop-reward", "none", "--stop-timesteps", "1600", "--checkpoint-every", "2",
        "--progress", "plain"]
"""A PPO run of 4 iterations with checkpoints after iterations 2 and 4."""


def _offline_env(base: Path, tag: str) -> dict[str, str]:
    """A CLI run's environment: W&B offline, its caches under ``base`` (not the home)."""
    env = cli_env(tag)
    env.update(WANDB_MODE="offline", WANDB_DATA_DIR=str(base / "wandb-data"),
               WANDB_CACHE_DIR=str(base / "wandb-cache"),
               WANDB_CONFIG_DIR=str(base / "wandb-config"))
    for name in ("WANDB_PROJECT", "WANDB_GROUP", "MLFLOW_TRACKING_URI",
                 "MLFLOW_EXPERIMENT_NAME"):
        env.pop(name, None)
    return env


def _train(args: list[str], base: Path, tag: str):
    import subprocess

    from tests.helpers.cluster import CLI

    return subprocess.run([*CLI, "train", *args], cwd=base, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=_offline_env(base, tag))


def _mlflow_client(store: Path):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store.resolve().as_uri())


def _both_installed() -> bool:
    return installed("wandb") and installed("mlflow")


# ---- settings -----------------------------------------------------------------------------
@pytest.mark.unit
def test_logger_config_is_read_from_both_file_layouts() -> None:
    """Top level of a flat file, or inside RLlib's ``config`` section; not a config key."""
    flat = config_file_sections("f.yaml", {"lr": 0.1, "logger_config": {"mlflow": {}}})
    assert flat.logger_config == {"mlflow": {}} and "logger_config" not in flat.values
    nested = config_file_sections("f.yaml", {"run": "PPO", "config": {
        "lr": 0.1, "logger_config": {"wandb": {"project": "p"}}}})
    assert nested.logger_config == {"wandb": {"project": "p"}}
    assert "logger_config" not in nested.values
    with pytest.raises(UsageError, match="two logger_config sections"):
        config_file_sections("f.yaml", {"run": "PPO", "logger_config": {},
                                        "config": {"logger_config": {}}})


@pytest.mark.unit
def test_bad_tracker_settings_are_refused_naming_the_key(monkeypatch) -> None:
    """Unknown sections and keys, a missing project or URI: one message each."""
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracker_settings(None) is None
    with pytest.raises(UsageError, match=r"has \['csv'\]; actorrl reads its sections wandb"):
        tracker_settings({"csv": {}})
    with pytest.raises(UsageError, match=r"logger_config.wandb has unknown settings "
                                         r"\['projekt'\]"):
        tracker_settings({"wandb": {"projekt": "x"}})
    with pytest.raises(UsageError, match="needs a project: --wandb PROJECT"):
        tracker_settings({"wandb": {}})
    with pytest.raises(UsageError, match="needs a tracking URI: --mlflow URI"):
        tracker_settings({"mlflow": {"experiment_name": "e"}})


@pytest.mark.unit
def test_a_missing_extra_names_the_pip_command(monkeypatch) -> None:
    """Without wandb / mlflow installed, asking for them fails before anything starts."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("wandb", "mlflow") else real(name, *a))
    with pytest.raises(UsageError, match=r'needs the \'wandb\' extra, and wandb is not '
                                         r'installed: pip install -e "\.\[wandb\]"'):
        tracker_settings(wandb_project="p")
    with pytest.raises(UsageError, match=r'pip install -e "\.\[mlflow\]"'):
        tracker_settings(mlflow_uri="./mlruns")


@pytest.mark.unit
def test_import_actorrl_and_training_without_trackers_import_neither() -> None:
    """The trackers' libraries load only when asked for."""
    import subprocess
    import sys

    from tests.helpers.procs import REPO, child_env

    code = ("import sys, actorrl, actorrl.experiment.train, actorrl.experiment.trackers; "
            "print(sorted(m for m in ('wandb', 'mlflow', 'onnx', 'safetensors') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.unit
def test_metrics_are_the_finite_numbers_flattened() -> None:
    result = {"episode_reward_mean": 1.5, "episode_reward_min": float("nan"), "done": True,
              "info": {"learner": {"default_policy": {"loss": 0.25}}, "name": "x"},
              "hist": [1, 2], "config": {"lr": 1.0}, "custom_metrics": {"a": 3}}
    assert result_metrics(result, excludes=["custom_metrics"]) == {
        "episode_reward_mean": 1.5, "done": 1.0, "info/learner/default_policy/loss": 0.25}


@pytest.mark.unit
def test_a_failing_tracker_is_dropped_and_training_goes_on(caplog) -> None:
    class Broken:
        name = "broken"

        def log_result(self, result):
            raise ConnectionError("server gone")

    class Fine:
        name = "fine"
        results: list = []

        def log_result(self, result):
            self.results.append(result)

    fine = Fine()
    trackers = TrackerSet([Broken(), fine])  # type: ignore[list-item]
    trackers.record({"a": 1})
    trackers.record({"a": 2})
    trackers.commit()  # results reach trackers once a checkpoint covers them
    assert fine.results == [{"a": 1}, {"a": 2}] and trackers.trackers == [fine]
    assert "broken tracker failed to log a result (ConnectionError: server gone)" in \
        caplog.text


# ---- real runs, read back -------------------------------------------------------------------
@pytest.mark.skipif(not _both_installed(), reason="the wandb and mlflow extras are not "
                    "installed (pip install -e \".[wandb,mlflow]\")")
def test_a_run_is_tracked_in_wandb_offline_and_mlflow_file_store(tmp_path: Path) -> None:
    """Every result at its iteration, the config, both checkpoints as artifacts, the final
    status; and no process left (W&B's service included)."""
    tag = f"trackers-{tmp_path.name}"
    output, store = tmp_path / "results", tmp_path / "mlruns"
    proc = _train(["ppo", *TINY, "--output", str(output), "--wandb", "arl-test",
                   "--mlflow", str(store)], tmp_path, tag)
    assert proc.returncode == 0, proc.stderr
    assert_no_process_left(tag)
    [run] = run_dirs(output)
    results = read_jsonl(run / "result.jsonl")
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint_000002", "checkpoint_000004"]

    from tests.helpers.wandb_offline import read_offline_run

    [folder] = (run / "wandb").glob("offline-run-*")
    logged = read_offline_run(folder)
    assert (logged.project, logged.name) == ("arl-test", run.name)
    assert logged.config["algorithm"] == "ppo" and logged.config["env"] == "CartPole-v1"
    assert logged.config["train_batch_size"] == 400
    assert [h["_step"] for h in logged.history] == [1, 2, 3, 4]
    for row, result in zip(logged.history, results):
        assert row["timesteps_total"] == result["timesteps_total"]
        assert row["episode_reward_mean"] == pytest.approx(result["episode_reward_mean"])
        assert row["info/learner/policy_loss"] == pytest.approx(
            result["info"]["learner"]["policy_loss"])
    assert [(name.split("-")[0], kind) for name, kind, _ in logged.artifacts] == [
        ("checkpoint", "model")] * 2
    assert all(sorted(files) == ["metadata.json", "state.bin"]
               for _, _, files in logged.artifacts)
    assert logged.exit_code == 0

    client = _mlflow_client(store)
    experiment = client.get_experiment_by_name("actorrl")
    [mlrun] = client.search_runs([experiment.experiment_id])
    assert mlrun.info.run_name == run.name and mlrun.info.status == "FINISHED"
    config = json.loads((run / "config.json").read_text())
    assert mlrun.data.params["algorithm"] == "ppo"
    assert mlrun.data.params["train_batch_size"] == str(config["train_batch_size"])
    assert mlrun.data.params["policy/lr"] == str(config["policy"]["lr"])
    history = client.get_metric_history(mlrun.info.run_id, "episode_reward_mean")
    assert [(m.step, m.value) for m in history] == [
        (r["training_iteration"], pytest.approx(r["episode_reward_mean"])) for r in results]
    assert mlrun.data.tags["actorrl.results_dir"] == str(run)
    artifacts = [a.path for a in client.list_artifacts(mlrun.info.run_id, "checkpoints")]
    assert artifacts == [f"checkpoints/{name}" for name in checkpoints]
    files = {a.path for a in client.list_artifacts(mlrun.info.run_id,
                                                   "checkpoints/checkpoint_000004")}
    assert files == {"checkpoints/checkpoint_000004/state.bin",
                     "checkpoints/checkpoint_000004/metadata.json"}


@pytest.mark.skipif(not _both_installed(), reason="the wandb and mlflow extras are not "
                    "installed (pip install -e \".[wandb,mlflow]\")")
def test_a_sweep_logs_one_run_per_trial_grouped(tmp_path: Path) -> None:
    """A grid of two trials with ``logger_config`` in the file: two W&B runs in the sweep's
    group, two MLflow runs in an experiment named after the sweep folder."""
    tag = f"tracked-sweep-{tmp_path.name}"
    store = tmp_path / "mlruns"
    sweep_file = tmp_path / "grid.yaml"
    sweep_file.write_text(
        "algorithm: ppo\nenv: CartPole-v1\nnum_workers: 1\ntrain_batch_size: 400\n"
        "lr: {grid_search: [0.001, 0.002]}\nstop: {timesteps_total: 800}\n"
        f"logger_config:\n  wandb: {{project: arl-sweep, upload_checkpoints: false}}\n"
        f"  mlflow: {{tracking_uri: {store}, save_artifact: false}}\n")
    output = tmp_path / "results"
    proc = _train(["--config", str(sweep_file), "--output", str(output), "--checkpoint-every",
                   "0", "--progress", "plain"], tmp_path, tag)
    assert proc.returncode == 0, proc.stderr
    assert_no_process_left(tag)
    [sweep_dir] = run_dirs(output)
    trials = [p for p in run_dirs(sweep_dir)]
    assert len(trials) == 2

    from tests.helpers.wandb_offline import read_offline_run

    runs = [read_offline_run(f) for t in trials for f in (t / "wandb").glob("offline-run-*")]
    assert sorted(r.name for r in runs) == sorted(t.name for t in trials)
    assert {(r.project, r.group) for r in runs} == {("arl-sweep", sweep_dir.name)}
    assert sorted(r.config["policy"]["lr"] for r in runs) == [0.001, 0.002]
    assert all(r.artifacts == [] for r in runs)

    client = _mlflow_client(store)
    experiment = client.get_experiment_by_name(sweep_dir.name)
    mlruns = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in mlruns) == sorted(t.name for t in trials)
    assert {r.data.tags["actorrl.group"] for r in mlruns} == {sweep_dir.name}
    assert sorted(r.data.params["policy/lr"] for r in mlruns) == ["0.001", "0.002"]
    assert all(client.list_artifacts(r.info.run_id) == [] for r in mlruns)


def test_asking_for_a_tracker_without_its_extra_is_exit_2_and_no_folder(tmp_path: Path
                                                                          ) -> None:
    """Run where the extra is hidden (a shadowing module that fails as a missing one):
    one error line naming the pip command, no results folder."""
    import subprocess

    from tests.helpers.cluster import CLI

    shadow = tmp_path / "shadow"
    shadow.mkdir()
    # find_spec() of a top-level name returns None only when nothing provides it; a
    # sitecustomize removes the real packages from the import system for this child.
    (shadow / "sitecustomize.py").write_text(
        "import importlib.util as u\n_real = u.find_spec\n"
        "def _find(name, *a):\n"
        "    return None if name.split('.')[0] in ('wandb', 'mlflow') else _real(name, *a)\n"
        "u.find_spec = _find\n")
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
    output = tmp_path / "results"
    proc = subprocess.run([*CLI, "train", "ppo", *TINY, "--output", str(output), "--mlflow",
                           str(tmp_path / "mlruns")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert 'pip install -e ".[mlflow]"' in proc.stderr
    assert not output.exists()


@pytest.mark.unit
def test_a_submitted_job_with_logger_config_is_refused_naming_train(tmp_path: Path) -> None:
    """``actorrl submit`` jobs are not tracked: the file's logger_config is refused with
    the command that does track."""
    import argparse

    from actorrl.cli.cluster import CommandError, _read_submission

    path = tmp_path / "job.yaml"
    path.write_text("algorithm: ppo\nlogger_config: {mlflow: {tracking_uri: ./mlruns}}\n")
    args = argparse.Namespace(config=str(path), set=[], algorithm=None)
    with pytest.raises(CommandError, match=r"a submitted job is not tracked.*actorrl train "
                                           r"--config .* --address ADDRESS"):
        _read_submission(args)


@pytest.mark.skipif(not _both_installed(), reason="the wandb and mlflow extras are not "
                    "installed (pip install -e \".[wandb,mlflow]\")")
def test_an_interrupted_run_ends_its_tracker_runs_as_interrupted(tmp_path: Path) -> None:
    """SIGINT after the first result: the run stops (exit 130) with its final checkpoint,
    and both trackers hold every result, that checkpoint and the interruption (MLflow
    KILLED, W&B exit code 130)."""
    import select
    import signal
    import subprocess
    import time

    from tests.helpers.cluster import CLI

    tag = f"tracked-sigint-{tmp_path.name}"
    output, store = tmp_path / "results", tmp_path / "mlruns"
    args = ["train", "ppo", "--env", "CartPole-v1", "--num-workers", "1", "--set",
            "train_batch_size=400", "--stop-reward", "none", "--stop-time", "120",
            "--checkpoint-every", "0", "--progress", "plain", "--output", str(output),
            "--wandb", "arl-sigint", "--mlflow", str(store)]
    proc = subprocess.Popen([*CLI, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_offline_env(tmp_path, tag))
    try:
        assert proc.stdout is not None
        seen, deadline = b"", time.monotonic() + RUN_TIMEOUT_S
        while b"result iter=" not in seen:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = proc.stdout.read1(65536)
                assert chunk, f"exit {proc.poll()}: {seen.decode(errors='replace')}"
                seen += chunk
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err.decode(errors="replace")
    assert_no_process_left(tag)
    [run] = run_dirs(output)
    results = read_jsonl(run / "result.jsonl")
    [checkpoint] = sorted((run / "checkpoints").iterdir())

    from tests.helpers.wandb_offline import read_offline_run

    [folder] = (run / "wandb").glob("offline-run-*")
    logged = read_offline_run(folder)
    assert [h["_step"] for h in logged.history] == [r["training_iteration"] for r in results]
    assert len(logged.artifacts) == 1 and logged.exit_code == 130

    client = _mlflow_client(store)
    [mlrun] = client.search_runs([client.get_experiment_by_name("actorrl").experiment_id])
    assert mlrun.info.status == "KILLED"
    history = client.get_metric_history(mlrun.info.run_id, "timesteps_total")
    assert [m.value for m in history] == [r["timesteps_total"] for r in results]
    assert [a.path for a in client.list_artifacts(mlrun.info.run_id, "checkpoints")] == [
        f"checkpoints/{checkpoint.name}"]
