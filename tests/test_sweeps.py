"""Sweeps: ``grid_search`` and ``num_samples`` in an ``actorrl train --config`` file.

The grid expansion is a pure function checked against expected trial lists (product order,
nested keys, RLlib's ``config:`` section, repeats and their seeds). Through the CLI, a
3-point grid of tiny CartPole trainings (1 worker, stopped by env steps only) writes one
folder per trial and a 3-row ``summary.csv``; a bad grid point refuses the sweep before
anything starts.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from actorrl.experiment.errors import UsageError
from actorrl.experiment.sweep import (
    Sweep,
    TrialOutcome,
    expand_grid,
    find_grids,
    read_sweep,
    sweep_exit_code,
    trial_folder_name,
)
from tests.helpers.cluster import assert_no_process_left, run_cli

RUN_TIMEOUT_S = 600.0
"""Deadline of the 3-trial CLI sweep (a test deadline, not a stop criterion)."""
QUICK_TIMEOUT_S = 120.0


def _points(trials: list) -> list[tuple[dict, int, int | None]]:
    return [(t.values, t.sample, t.seed) for t in trials]


# ---- grid expansion ---------------------------------------------------------------------
def test_product_of_grids_last_key_fastest() -> None:
    data = {"env": {"grid_search": ["CartPole-v1", "Acrobot-v1"]},
            "lr": {"grid_search": [0.1, 0.01]}, "gamma": 0.9}
    trials = expand_grid(data)
    assert _points(trials) == [
        ({"env": "CartPole-v1", "lr": 0.1}, 0, None),
        ({"env": "CartPole-v1", "lr": 0.01}, 0, None),
        ({"env": "Acrobot-v1", "lr": 0.1}, 0, None),
        ({"env": "Acrobot-v1", "lr": 0.01}, 0, None),
    ]
    assert [t.index for t in trials] == [0, 1, 2, 3]
    assert trials[1].data == {"env": "CartPole-v1", "lr": 0.01, "gamma": 0.9}
    assert data["lr"] == {"grid_search": [0.1, 0.01]}  # the input is not changed


def test_nested_keys_and_rllib_config_section() -> None:
    data = {"run": "PPO", "env": "CartPole-v1",
            "config": {"model": {"fcnet_hiddens": {"grid_search": [[32], [64, 64]]},
                                 "fcnet_activation": "tanh"},
                       "lr": {"grid_search": [0.001, 0.0001]}}}
    trials = expand_grid(data)
    assert [t.values for t in trials] == [
        {"model.fcnet_hiddens": [32], "lr": 0.001},
        {"model.fcnet_hiddens": [32], "lr": 0.0001},
        {"model.fcnet_hiddens": [64, 64], "lr": 0.001},
        {"model.fcnet_hiddens": [64, 64], "lr": 0.0001},
    ]
    assert trials[2].data["config"] == {
        "model": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}, "lr": 0.001}


def test_num_samples_repeats_every_point_with_seed_plus_k() -> None:
    data = {"lr": {"grid_search": [0.1, 0.2]}, "seed": 10}
    assert _points(expand_grid(data, num_samples=3)) == [
        ({"lr": 0.1}, 0, 10), ({"lr": 0.2}, 0, 10),
        ({"lr": 0.1}, 1, 11), ({"lr": 0.2}, 1, 11),
        ({"lr": 0.1}, 2, 12), ({"lr": 0.2}, 2, 12),
    ]
    # --seed wins over the file's seed; RLlib's config section's seed is read too.
    assert [t.seed for t in expand_grid({"config": {"seed": 3}}, 2, seed=7)] == [7, 8]
    assert [t.seed for t in expand_grid({"config": {"seed": 3}}, 2)] == [3, 4]
    # No seed anywhere: repeats differ by sample only.
    assert _points(expand_grid({"lr": 0.1}, 2)) == [({}, 0, None), ({}, 1, None)]


def test_malformed_grids_are_refused_with_the_fix() -> None:
    with pytest.raises(UsageError, match=r"lr: grid_search needs a non-empty list"):
        find_grids({"lr": {"grid_search": []}})
    with pytest.raises(UsageError, match=r"model.fcnet_hiddens: a grid_search mapping"):
        find_grids({"model": {"fcnet_hiddens": {"grid_search": [[1]], "other": 1}}})
    with pytest.raises(UsageError, match="num_samples must be >= 1"):
        expand_grid({}, num_samples=0)


def test_read_sweep_of_rllib_layout_and_plain_files(tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text("algorithm: ppo\nlr: 0.001\n")
    assert read_sweep(str(plain)) is None  # no grid, no num_samples: one ordinary run
    rllib = tmp_path / "rllib.yaml"
    rllib.write_text("my-exp:\n  run: PPO\n  env: {grid_search: [CartPole-v1, Acrobot-v1]}\n"
                     "  num_samples: 2\n  config:\n    seed: 1\n")
    sweep = read_sweep(str(rllib))
    assert sweep is not None and sweep.name == "my-exp" and sweep.num_samples == 2
    assert [(t.values["env"], t.seed) for t in sweep.trials] == [
        ("CartPole-v1", 1), ("Acrobot-v1", 1), ("CartPole-v1", 2), ("Acrobot-v1", 2)]
    assert "num_samples" not in sweep.trials[0].data
    names = [trial_folder_name(t, sweep, "ppo", t.values["env"]) for t in sweep.trials]
    assert names == ["ppo_CartPole-v1_seed=1", "ppo_Acrobot-v1_seed=1",
                     "ppo_CartPole-v1_seed=2", "ppo_Acrobot-v1_seed=2"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: ppo\nnum_samples: two\n")
    with pytest.raises(UsageError, match="num_samples must be an integer >= 1"):
        read_sweep(str(bad))


def test_exit_code_is_the_first_unfinished_trials() -> None:
    sweep = Sweep(path="f", name="f", num_samples=1, grid_keys=[],
                  trials=expand_grid({}, 3))
    outcomes = [TrialOutcome(trial=t, label="") for t in sweep.trials]
    for outcome, code in zip(outcomes, (0, 1, 130)):
        outcome.exit_code = code
    assert sweep_exit_code(outcomes) == 1
    outcomes[1].exit_code = 0
    assert sweep_exit_code(outcomes) == 130
    outcomes[2].exit_code = 0
    assert sweep_exit_code(outcomes) == 0


# ---- through the CLI --------------------------------------------------------------------
GRID_FILE = """\
cartpole-grid:
  run: PPO
  env: CartPole-v1
  config:
    lr: {grid_search: [0.001, 0.0005, 0.0003]}
    num_workers: 1
    min_iter_time_s: 0
    train_batch_size: 500
    sgd_minibatch_size: 128
    num_sgd_iter: 1
    seed: 1
"""


def test_a_grid_of_three_trials_writes_three_folders_and_a_summary(tmp_path: Path) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text(GRID_FILE)
    output = tmp_path / "results"
    tag = f"sweep-{tmp_path.name}"
    proc = run_cli(["train", "--config", str(config), "--stop-timesteps", "2000",
                    "--stop-reward", "none", "--stop-time", "none", "--output", str(output)],
                   cwd=tmp_path, timeout_s=RUN_TIMEOUT_S, tag=tag)
    assert proc.returncode == 0, proc.stderr
    sweeps = list(output.iterdir())
    assert len(sweeps) == 1 and sweeps[0].name.startswith("cartpole-grid_")
    trials = sorted(p.name for p in sweeps[0].iterdir() if p.is_dir())
    assert trials == ["ppo_CartPole-v1_lr=0.0003_seed=1", "ppo_CartPole-v1_lr=0.0005_seed=1",
                      "ppo_CartPole-v1_lr=0.001_seed=1"]
    for name in trials:
        assert (sweeps[0] / name / "result.jsonl").is_file()
    with (sweeps[0] / "summary.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["lr"], r["status"], r["exit_code"]) for r in rows] == [
        ("0.001", "finished", "0"), ("0.0005", "finished", "0"), ("0.0003", "finished", "0")]
    assert all(int(r["timesteps_total"]) >= 2000 for r in rows)
    assert all(r["best_episode_reward_mean"] and r["final_episode_reward_mean"] for r in rows)
    assert "summary:" in proc.stdout and "lr=0.0005 seed=1" in proc.stdout
    assert_no_process_left(tag)
    # actorrl plot SWEEP_FOLDER overlays the trials.
    plot = run_cli(["plot", str(sweeps[0]), "-o", str(tmp_path / "curves.png")],
                   cwd=tmp_path, timeout_s=QUICK_TIMEOUT_S)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_bad_grid_point_refuses_the_sweep_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("algorithm: ppo\nenv: CartPole-v1\nnum_workers: 1\n"
                      "lr: {grid_search: [0.001, fast]}\n")
    output = tmp_path / "results"
    proc = run_cli(["train", "--config", str(config), "--output", str(output)],
                   cwd=tmp_path, timeout_s=QUICK_TIMEOUT_S)
    assert proc.returncode == 2
    assert "sweep trial 2/2 (lr=fast)" in proc.stderr and "lr" in proc.stderr
    assert "no trial was started" in proc.stderr
    assert not output.exists()


def test_restore_with_a_sweep_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text("algorithm: ppo\nlr: {grid_search: [0.001, 0.01]}\n")
    proc = run_cli(["train", "--config", str(config), "--restore", str(tmp_path),
                    "--output", str(tmp_path / "results")], cwd=tmp_path,
                   timeout_s=QUICK_TIMEOUT_S)
    assert proc.returncode == 2
    assert "--restore cannot be combined with a sweep" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_address_sweep_submits_one_job_per_trial_n_at_once(tmp_path: Path) -> None:
    """With ``--address`` each trial is a job of its own (here through test_cli's stub
    client, whose jobs end by themselves), two at a time with ``--concurrent-trials 2``."""
    import subprocess
    import sys

    from tests.helpers.cluster import cli_env
    from tests.test_cli import FAKE_CLIENT, _fake_calls

    config = tmp_path / "grid.yaml"
    config.write_text("algorithm: apex\nlr: {grid_search: [0.001, 0.002, 0.003]}\n")
    env = cli_env()
    env.pop("ACTORRL_KEYS_DIR", None)
    env["FAKE_JOB_RESULTS"] = "2"
    proc = subprocess.run([sys.executable, "-c", FAKE_CLIENT, "train", "--address",
                           "tcp://10.0.0.1:7000", "--config", str(config),
                           "--concurrent-trials", "2", "--output", str(tmp_path / "results")],
                          cwd=tmp_path, capture_output=True, text=True,
                          timeout=QUICK_TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stderr
    calls = [line for line in proc.stdout.splitlines() if line.startswith("FAKE submit ")]
    submitted = sorted(_fake_calls(line)[1]["policy"]["lr"] for line in calls)
    assert submitted == [0.001, 0.002, 0.003]
    (sweep_dir,) = (tmp_path / "results").iterdir()
    with (sweep_dir / "summary.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["lr"], r["status"], r["timesteps_total"]) for r in rows] == [
        ("0.001", "finished", "2000"), ("0.002", "finished", "2000"),
        ("0.003", "finished", "2000")]
