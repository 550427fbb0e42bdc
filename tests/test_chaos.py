"""The bounded version of ``benchmarks/chaos.py``: an Ape-X CartPole job on a coordinator
and three node agents (separate processes on loopback: ``--loopback`` also when run as
root; ``tests/test_chaos_netns.py`` runs them in network namespaces) loses a rollout
worker, then its learner, then the coordinator itself (restarted on its state dir), each
at a fixed result count; it must finish, its result stream must say where it rolled back
(and never count lost work), and nothing of the cluster may be left running.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.benchmark_scripts import load_benchmark

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("chaos")]


def _chaos() -> Any:
    return load_benchmark("chaos")


def test_invariants_catch_iterations_that_skip_or_repeat_without_a_rollback():
    chaos = _chaos()
    ok = [{"training_iteration": 1, "timesteps_total": 10},
          {"training_iteration": 2, "timesteps_total": 20},
          {"training_iteration": 2, "timesteps_total": 20,
           "info": {"num_restarts": 1, "restored_iteration": 1}},
          {"training_iteration": 3, "timesteps_total": 30, "info": {"num_restarts": 1}}]
    assert chaos.check_invariants(ok) == []
    repeated = ok[:2] + [{"training_iteration": 2, "timesteps_total": 20}]
    assert chaos.check_invariants(repeated) == ["iteration 2 after 2 with no rollback"]
    wrong_resume = ok[:2] + [{"training_iteration": 3, "timesteps_total": 30,
                              "info": {"num_restarts": 1, "restored_iteration": 1}}]
    assert chaos.check_invariants(wrong_resume) == ["iteration 3 after a rollback to 1"]


def test_a_job_survives_a_worker_a_learner_and_the_coordinator_dying(capsys):
    chaos = _chaos()
    out = chaos.main(["--loopback", "--jobs", "apex", "--no-undisturbed",
                      "--faults-at", "2:worker,4:learner,7:coordinator",
                      "--set", "apex.stop.episode_reward_mean=1000",
                      "--set", "apex.stop.training_iteration=12",
                      "--set", "apex.job.checkpoint_interval_s=0"])
    assert out["network"] == "loopback", out
    [job] = out["jobs"]
    run = job["faults"]
    assert run["state"] == "finished", run
    assert [f["kind"] for f in run["faults"]] == ["worker", "learner", "coordinator"], run
    assert run["faults_not_injected"] == []
    assert run["job_failures"] >= 1, run  # the learner's death restarted the job
    assert run["rollbacks"], run  # ... and its results say where it rolled back to
    assert run["invariant_problems"] == [], run
    assert out["processes_left"] == [] and out["session_folders_left"] == [], out
    assert out["shm_segments_left"] == [], out
