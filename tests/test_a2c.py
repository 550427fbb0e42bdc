"""A2C's microbatch pipeline on real worker processes: a rollout worker that dies is
replaced in its slot and the step goes on (issue 37, item 8c), as in the PPO pipeline."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.failures import train_past_a_killed_worker

TRAIN_BATCH = 512
"""Env steps per A2C step (two microbatches of 256)."""


async def test_a_dead_a2c_worker_is_replaced_and_its_step_goes_on(tmp_path: Path) -> None:
    """SIGKILL of a rollout worker between iterations: the next step's weight broadcast
    finds it dead, a replacement takes its slot and that step (and the one after) trains
    on full batches; the failure and the restart are reported. Each iteration is one
    step (no minimum time), so the run is bounded by steps."""
    first, results, dead, workers = await train_past_a_killed_worker("a2c", {
        "num_workers": 2, "seed": 0, "train_batch_size": TRAIN_BATCH,
        "microbatch_size": TRAIN_BATCH // 2, "min_iter_time_s": 0,
        "timesteps_per_iteration": 0}, tmp_path)
    assert len(workers) == 2 and dead not in workers
    last = results[-1]
    info = last["info"]
    assert info["num_worker_restarts"] == 1 and info["num_worker_failures"] == 1
    assert last["num_healthy_workers"] == 2
    assert last["timesteps_total"] >= first["timesteps_total"] + 2 * TRAIN_BATCH
    assert info["num_steps_trained"] >= 3 * TRAIN_BATCH
