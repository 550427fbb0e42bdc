"""IMPALA on two fake (CPU) towers, run as a user runs it: ``actorrl train impala --set
num_gpus=2 --set _fake_gpus=true`` learns CartPole and reports its two towers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cluster import assert_no_process_left, read_jsonl, run_cli, run_dirs

pytestmark = pytest.mark.slow

THRESHOLD = 150.0
STOP_TIME_S = 200


def test_impala_learns_cartpole_on_two_fake_gpu_towers(tmp_path: Path) -> None:
    """The run stops at the reward threshold (exit 0) within its time budget; every
    result names 2 towers."""
    output = tmp_path / "results"
    tag = f"fake-gpus-{tmp_path.name}"
    proc = run_cli(["train", "impala", "--set", "num_gpus=2", "--set", "_fake_gpus=true",
                    "--set", "min_iter_time_s=1", "--seed", "0",
                    "--stop-reward", str(THRESHOLD), "--stop-time", str(STOP_TIME_S),
                    "--output", str(output)], cwd=tmp_path, timeout_s=STOP_TIME_S + 120,
                   tag=tag)
    assert proc.returncode == 0, proc.stderr
    [run] = run_dirs(output)
    results = read_jsonl(run / "result.jsonl")
    assert results and all(r["info"]["num_towers"] == 2 for r in results)
    best = max(r["episode_reward_mean"] for r in results
               if r["episode_reward_mean"] == r["episode_reward_mean"])
    assert best >= THRESHOLD, [round(r["episode_reward_mean"], 1) for r in results]
    assert results[-1]["num_steps_trained"] > 0
    assert_no_process_left(tag)
