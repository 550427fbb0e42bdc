"""Results that do not lie (issue 45 item 3) for cluster jobs: after a restart from a
checkpoint a job's iterations and counters continue from the checkpoint's and every later
result says so; the rows already written stay as written; ``result.jsonl`` and
``job.json`` survive a kill between their writes and a torn last line; trackers never
receive a superseded step.

Each test failed on the code before: a job resumed at its last *reported* counters (no
``restored_iteration``), a torn line made ``ManagedJob.load`` raise (a restarted
coordinator dropped the job), a kill between the writes left ``job.json``'s stale counters
in charge, and trackers logged every row as it came.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from actorrl.cluster.jobs import JobManager, ManagedJob, Submission
from actorrl.experiment.plot import load_curve
from actorrl.experiment.results import current_results
from actorrl.experiment.trackers import TrackerSet
from tests.helpers.cluster import read_jsonl
from tests.helpers.procs import pids_alive


def _row(iteration: int, timesteps: int) -> dict[str, Any]:
    return {"training_iteration": iteration, "timesteps_total": timesteps,
            "timesteps_this_iter": 100, "num_steps_trained": 0,
            "time_total_s": float(iteration), "episode_reward_mean": float(iteration),
            "info": {}}


def _job_with_rows(tmp_path: Path, rows: int) -> ManagedJob:
    job = ManagedJob("job-t", Submission.parse({"algorithm": "apex"}),
                     str(tmp_path / "jobs" / "job-t"))
    job.state = "running"
    for i in range(1, rows + 1):
        job.publish(_row(i, 100 * i))
    return job


@pytest.mark.unit
async def test_a_torn_last_line_is_skipped_with_a_warning_not_a_dropped_job(
        tmp_path: Path) -> None:
    """A coordinator killed while appending a row leaves half a line: the job loads with
    the complete rows (before: json.loads raised and resume_all dropped the job), the
    fragment moves to result.jsonl.torn, and rows appended later are whole lines."""
    job = _job_with_rows(tmp_path, 3)
    results = Path(job.dir) / "result.jsonl"
    with open(results, "a") as f:
        f.write(json.dumps(_row(4, 400))[:25])  # the kill fell mid-write
    coordinator = SimpleNamespace(on_actor_died=[], extra_status=[])
    manager = JobManager(coordinator, str(tmp_path))  # type: ignore[arg-type]
    try:
        reloaded = ManagedJob.load(job.dir)
        assert reloaded.num_results == 3
        assert reloaded.last_counters["training_iteration"] == 3
        assert (Path(job.dir) / "result.jsonl.torn").read_text().startswith('{"training_')
        assert "cut short" in (Path(job.dir) / "job.log").read_text()
        reloaded.publish(_row(4, 400))
        rows = read_jsonl(results)  # every line parses
        assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
    finally:
        await manager.shutdown(checkpoint=False)


@pytest.mark.unit
def test_a_kill_between_result_and_record_leaves_result_jsonl_in_charge(
        tmp_path: Path) -> None:
    """result.jsonl got row 4, job.json did not (the kill fell between the two writes):
    the loaded job's counters and count are row 4's (before: job.json's row 3, so the
    resumed job published iteration 4 a second time as if new)."""
    job = _job_with_rows(tmp_path, 3)
    record = (Path(job.dir) / "job.json").read_text()
    job.publish(_row(4, 400))
    (Path(job.dir) / "job.json").write_text(record)  # as the kill left it
    reloaded = ManagedJob.load(job.dir)
    assert reloaded.num_results == 4
    assert reloaded.last_counters["training_iteration"] == 4
    assert reloaded.last_counters["timesteps_total"] == 400
    assert reloaded.rollbacks.reported_timesteps == 400


class RecordingTracker:
    """A tracker that remembers the steps it was given."""

    name = "recording"

    def __init__(self) -> None:
        self.steps: list[tuple[int, float]] = []

    def log_result(self, result: dict[str, Any]) -> None:
        self.steps.append((result["training_iteration"], result["episode_reward_mean"]))

    def close(self, status: str, exit_code: int) -> None:
        del status, exit_code


@pytest.mark.unit
def test_trackers_never_receive_a_superseded_step() -> None:
    """Iterations 1-4 with a checkpoint after 2, a rollback to it, then 3'-5: the tracker
    gets 1, 2, 3', 4', 5 (before: 1, 2, 3, 4, 3', 4', 5, W&B dropping the repeats); a
    cluster job's results commit through its checkpoint_iteration."""
    tracker = RecordingTracker()
    trackers = TrackerSet([tracker])  # type: ignore[list-item]
    for i in (1, 2):
        trackers.record({"training_iteration": i, "episode_reward_mean": float(i)})
    trackers.commit(2)  # the checkpoint of iteration 2
    assert tracker.steps == [(1, 1.0), (2, 2.0)]
    for i in (3, 4):
        trackers.record({"training_iteration": i, "episode_reward_mean": float(i)})
    for i in (3, 4, 5):  # after the rollback to iteration 2
        trackers.record({"training_iteration": i, "episode_reward_mean": 10.0 + i})
    trackers.close("finished", 0)
    assert tracker.steps == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]


@pytest.mark.timeout(300)
def test_a_rolled_back_job_continues_from_the_checkpoint_and_says_so(
        tmp_path: Path) -> None:
    """A job checkpointed at its first iteration only loses its learner after iteration 3
    or later: the next result is iteration 2 again with info.restored_iteration 1 and
    num_restarts 1, timesteps_total below the lost rows' (info.timesteps_lost counts them),
    the rows already written are unchanged, and the job's curve (actorrl plot) has each
    iteration once. Before: the job went on at iteration 4 with the last reported counters
    and no mark."""
    from actorrl.cluster.client import Client
    from tests.test_cluster import APEX_TINY, actor_named, next_result

    state = tmp_path / "state"
    with Client.local(num_cpus=4, state_dir=str(state)) as client:
        job = client.submit({**APEX_TINY, "job": {
            "checkpoint_interval_s": 3600, "restart_backoff_s": 0}})
        pids: list[int] = []
        try:
            before, after = next_result(job, 0, lambda r: r["training_iteration"] >= 3, 150)
            learner = actor_named(job, "learner")
            pids.append(learner["pid"])
            os.kill(learner["pid"], signal.SIGKILL)
            result, after = next_result(
                job, after, lambda r: r["info"].get("num_restarts", 0) >= 1, 200)
            written_before = read_jsonl(state / "jobs" / job.id / "result.jsonl")[:after - 1]
            pids += [a["pid"] for a in job.actors()]
            log = job.logs()
        finally:
            job.stop()
    info = result["info"]
    assert info["restored_iteration"] == 1, info
    assert result["training_iteration"] == 2, result["training_iteration"]
    assert result["timesteps_total"] < before["timesteps_total"]
    assert info["timesteps_lost"] >= before["timesteps_total"] - written_before[0][
        "timesteps_total"]
    assert info["timesteps_sampled_all"] == result["timesteps_total"] + info["timesteps_lost"]
    rows = read_jsonl(state / "jobs" / job.id / "result.jsonl")
    assert rows[:len(written_before)] == written_before  # never rewritten
    assert all("num_restarts" not in r["info"] for r in written_before)
    iterations = [r["training_iteration"] for r in current_results(rows)]
    assert iterations == sorted(set(iterations)), iterations
    curve = load_curve(state / "jobs" / job.id)
    assert len(curve.timesteps) == len(iterations)
    assert "rolled back to iteration 1" in log, log
    assert pids_alive(pids, 30) == []
