"""A cluster job that loses its learner keeps its live rollout workers and replay shards
(issue 45 item 2, for jobs as for a local ``actorrl train``): the restart replaces only the
learner, the shard keeps its rows, and the job log says what was kept. Before, every
attempt ran on a driver of its own that stopped all of the job's actors, so a learner loss
emptied the replay.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers.procs import pids_alive

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(300)
def test_a_job_restart_keeps_the_live_workers_and_replay_shards(tmp_path: Path) -> None:
    from actorrl.cluster.client import Client
    from tests.test_cluster import APEX_TINY, actor_named, next_result

    with Client.local(num_cpus=4, state_dir=str(tmp_path / "state")) as client:
        job = client.submit({**APEX_TINY, "learning_starts": 2000, "job": {
            "checkpoint_interval_s": 0, "restart_backoff_s": 0}})
        pids: list[int] = []
        try:
            before, after = next_result(
                job, 0, lambda r: r["info"].get("num_steps_trained", 0) > 0, 150)
            kept = {a["name"]: a["actor_id"] for a in job.actors()
                    if a["name"].startswith(("worker-", "replay-"))}
            learner = actor_named(job, "learner")
            pids.append(learner["pid"])
            os.kill(learner["pid"], signal.SIGKILL)
            result, after = next_result(
                job, after, lambda r: r["info"].get("num_restarts", 0) >= 1, 200)
            # Training resumes from the kept shard's rows, without sampling learning_starts
            # env steps again.
            trained, _ = next_result(
                job, after - 1, lambda r: r["info"].get("num_steps_trained", 0)
                > result["info"].get("num_steps_trained", 0), 120)
            now = {a["name"]: a["actor_id"] for a in job.actors()
                   if a["name"].startswith(("worker-", "replay-"))}
            new_learner = actor_named(job, "learner")
            pids += [a["pid"] for a in job.actors()]
            log = job.logs()
        finally:
            job.stop()
    assert kept and now == kept, (kept, now)
    assert new_learner["actor_id"] != learner["actor_id"]
    assert trained["timesteps_total"] - result["timesteps_total"] < 2000, (
        trained["timesteps_total"], result["timesteps_total"])
    assert "keeping 3 live actors" in log, log
    assert pids_alive(pids, 30) == []


@pytest.mark.timeout(300)
def test_a_job_trains_on_while_its_checkpoint_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job checkpointing after every iteration whose first interval write is held: three
    more results arrive while it is held, then it lands (job.checkpoint moves to it and
    on), writes never overlap, and the job's final checkpoint is on disk. Before, the job's
    run loop awaited each write, so no result came while one was held."""
    import threading

    import actorrl.cluster.jobs as jobs_module
    from actorrl.cluster.client import Client
    from tests.test_cluster import APEX_TINY, next_result

    released, writing = threading.Event(), threading.Lock()
    real_write, calls, overlapping = jobs_module.write_checkpoint, [], []

    def slow_write(parent, state, metadata):
        if not writing.acquire(blocking=False):
            overlapping.append(int(state["iteration"]))
            writing.acquire()
        try:
            calls.append(int(state["iteration"]))
            if len(calls) == 2:  # the first is the first iteration's; hold the next one
                released.wait(120)
            return real_write(parent, state, metadata)
        finally:
            writing.release()

    monkeypatch.setattr(jobs_module, "write_checkpoint", slow_write)
    with Client.local(num_cpus=4, state_dir=str(tmp_path / "state")) as client:
        job = client.submit({**APEX_TINY, "stop": {"training_iteration": 12},
                             "job": {"checkpoint_interval_s": 0}})
        try:
            _, after = next_result(job, 0, lambda r: len(calls) >= 2, 150)
            held_at = len(calls)
            seen = []
            for _ in range(3):  # results keep coming while the write is held
                result, after = next_result(job, after, lambda r: True, 60)
                seen.append(result["training_iteration"])
            assert not released.is_set() and len(calls) == held_at, calls
            released.set()
            for _ in job.results(after=after, timeout_s=120):
                pass
            status = job.status()
        finally:
            released.set()
            job.stop()
    assert len(seen) == 3 and seen == sorted(seen), seen
    assert overlapping == [], overlapping
    assert status["state"] == "finished", status
    checkpoint = status["checkpoint"]
    assert checkpoint["iteration"] == 12 and Path(checkpoint["path"]).is_dir(), checkpoint
