"""Long runs survive (issue 45): the restart policy (failures counted in a sliding window,
exponential backoff) for cluster jobs and a local ``actorrl train``, whose learner death
now restarts the learner from the last checkpoint; failure counters that continue across
a restart; a recovered worker death as one line in the job log; checkpoint retention.

The policy's arithmetic runs on a fake clock; the runs are real processes (SIGKILLed
learners and workers), every wait bounded by events, lines or results, never by sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from actorrl.algorithms.checkpoints import METADATA_FILE, STATE_FILE, list_checkpoints
from actorrl.algorithms.restarts import CarriedCounters, FailureWindow, RestartPolicy
from actorrl.cluster.jobs import JobManager, ManagedJob, Submission
from actorrl.config.sections import ConfigError
from actorrl.experiment.plot import load_curve
from actorrl.experiment.results import ResultWriter, current_results, rollback_step
from actorrl.experiment.retention import SCORE_KEY, Retention
from tests.helpers.cluster import assert_no_process_left, read_jsonl, run_dirs
from tests.helpers.procs import descendants, pids_alive
from tests.test_cli import FIRST_RESULT_TIMEOUT_S, LineReader, finish, start_cli

RUN_TIMEOUT_S = 420.0


class FakeClock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# ---- the policy -------------------------------------------------------------------------
def test_failures_are_counted_within_the_window_not_since_the_start() -> None:
    """Two failures per hour allowed: a third within the hour fails, the same third an
    hour after the first restarts."""
    clock = FakeClock()
    window = FailureWindow(RestartPolicy(max_failures=2, failure_window_s=3600), clock=clock)
    assert window.record().restart
    clock.now += 1800
    assert window.record().restart
    clock.now += 1799
    third = window.record()
    assert not third.restart and third.failures_in_window == 3
    assert "over the limit" in third.describe() and "3600" in third.describe()

    window = FailureWindow(RestartPolicy(max_failures=2, failure_window_s=3600), clock=clock)
    window.record()
    clock.now += 1800
    window.record()
    clock.now += 1801  # the first failure left the window
    decision = window.record()
    assert decision.restart and decision.failures_in_window == 2


def test_restarts_back_off_exponentially_up_to_a_cap() -> None:
    """The delay doubles with each failure in the window, capped; it starts over once
    the window has emptied."""
    clock = FakeClock()
    policy = RestartPolicy(max_failures=None, failure_window_s=600, backoff_initial_s=1,
                           backoff_max_s=60)
    window = FailureWindow(policy, clock=clock)
    delays = [window.record().delay_s for _ in range(9)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    clock.now += 601
    assert window.record().delay_s == 1


def test_unlimited_zero_and_since_the_start() -> None:
    """-1 and None restart without limit; 0 never restarts; no window counts since the
    start (the old behaviour, still available)."""
    clock = FakeClock()
    for limit in (None, -1):
        window = FailureWindow(RestartPolicy(max_failures=limit), clock=clock)
        assert all(window.record().restart for _ in range(100))
    assert not FailureWindow(RestartPolicy(max_failures=0), clock=clock).record().restart
    window = FailureWindow(RestartPolicy(max_failures=1, failure_window_s=None), clock=clock)
    assert window.record().restart
    clock.now += 10 ** 7
    assert not window.record().restart


def test_job_options_take_a_window_and_refuse_bad_values() -> None:
    """``job.failure_window_s`` and an unlimited ``job.max_failures`` are accepted; bad
    values are one ConfigError naming each."""
    parsed = Submission.parse({"algorithm": "apex", "job": {
        "max_failures": None, "failure_window_s": 600}})
    assert parsed.options.restart_policy().unlimited
    assert parsed.options.restart_policy().failure_window_s == 600
    defaults = Submission.parse({"algorithm": "apex"}).options.restart_policy()
    assert defaults.max_failures == 20 and defaults.failure_window_s == 3600
    with pytest.raises(ConfigError) as caught:
        Submission.parse({"algorithm": "apex", "job": {"max_failures": -5,
                                                       "failure_window_s": 0}})
    assert "job.max_failures" in str(caught.value)
    assert "job.failure_window_s" in str(caught.value)


def test_failure_counters_continue_across_restarts() -> None:
    """A restarted trainer counts from 0; the results add what earlier attempts counted,
    also through a record (a restarted coordinator)."""
    carried = CarriedCounters()
    first = {"info": {"num_worker_restarts": 2, "num_worker_failures": 2}}
    carried.apply(first)
    carried.restarted()
    second = {"info": {"num_worker_restarts": 1, "num_worker_failures": 1,
                       "learner": {"x": 1}}}
    carried.apply(second)
    assert second["info"]["num_worker_restarts"] == 3
    assert second["info"]["num_worker_failures"] == 3
    resumed = CarriedCounters(carried.totals())
    third = {"info": {"num_worker_restarts": 0}}
    resumed.apply(third)
    assert third["info"]["num_worker_restarts"] == 3


class StubDriver:
    """Stands for a job's ClusterDriver where the attempts are stubs (nothing to place)."""

    async def shutdown(self) -> None:
        """Nothing was started."""


async def test_a_job_restarts_as_long_as_its_window_allows(tmp_path: Path) -> None:
    """The job loop (its attempts replaced by failing stubs): with at most 1 failure per
    100 s, failures 200 s apart restart the job every time (before, the second failure
    since the job began failed it); two within 100 s fail it, naming the limit. The
    failure times and counters are in job.json for a restarted coordinator."""
    coordinator = SimpleNamespace(on_actor_died=[], extra_status=[])
    manager = JobManager(coordinator, str(tmp_path))  # type: ignore[arg-type]
    try:
        clock = FakeClock()
        submission = Submission.parse({"algorithm": "apex", "job": {
            "max_failures": 1, "failure_window_s": 100, "restart_backoff_s": 0}})
        job = ManagedJob("job-a", submission, str(tmp_path / "jobs" / "job-a"))
        job.failures.clock = clock
        gaps = iter([200.0, 200.0, 200.0])
        attempts = 0

        async def attempt(_job: ManagedJob, _driver: Any, _survivors: Any) -> None:
            nonlocal attempts
            attempts += 1
            _job.publish({"training_iteration": attempts,
                          "info": {"num_worker_restarts": 1}})
            gap = next(gaps, None)
            if gap is None:
                _job.stop_reason = "done"
                return
            clock.now += gap
            raise RuntimeError("learner died")

        manager._attempt = attempt  # type: ignore[method-assign]
        manager._new_driver = lambda _job: StubDriver()  # type: ignore[method-assign]
        await manager._run(job)
        assert job.state == "finished" and attempts == 4 and job.num_failures == 3
        assert job.results[-1]["info"]["num_worker_restarts"] == 4  # one per attempt
        record = json.loads((Path(job.dir) / "job.json").read_text())
        assert record["carried_counters"]["num_worker_restarts"] == 4
        reloaded = ManagedJob.load(job.dir)  # what a restarted coordinator reads
        assert reloaded.failures.times == job.failures.times
        assert reloaded.carried.totals()["num_worker_restarts"] == 4

        job = ManagedJob("job-b", submission, str(tmp_path / "jobs" / "job-b"))
        job.failures.clock = clock
        gaps = iter([50.0, 50.0, 50.0])
        attempts = 0
        await manager._run(job)
        assert job.state == "failed" and attempts == 2
        log = (Path(job.dir) / "job.log").read_text()
        assert "over the limit (at most 1 failures per 100 s)" in log, log
    finally:
        await manager.shutdown(checkpoint=False)


# ---- results after a rollback ----------------------------------------------------------------
def _row(iteration: int, timesteps: int, this_iter: int = 100) -> dict[str, Any]:
    return {"training_iteration": iteration, "timesteps_total": timesteps,
            "timesteps_this_iter": this_iter, "time_this_iter_s": 1.0,
            "episode_reward_mean": float(iteration)}


def test_rolled_back_rows_leave_the_curve_and_tensorboard(tmp_path: Path) -> None:
    """Iterations 1-4, a restart from iteration 2's checkpoint, iterations 3-5: the
    curve is 1, 2, 3', 4', 5 (the superseded 3 and 4 left out, the rows still written),
    and TensorBoard gets a new event file that purges the steps after the checkpoint."""
    from tensorboardX.proto.event_pb2 import SessionLog

    from tests.helpers.cluster import read_tensorboard_events

    rows = [_row(1, 100), _row(2, 200), _row(3, 300), _row(4, 400),
            _row(3, 250, 50), _row(4, 350), _row(5, 450)]
    assert rollback_step(rows[4], rows[3]) == 201
    assert rollback_step(rows[3], rows[2]) is None and rollback_step(rows[0], None) is None
    assert [(r["training_iteration"], r["timesteps_total"])
            for r in current_results(rows)] == [(1, 100), (2, 200), (3, 250), (4, 350),
                                                (5, 450)]
    writer = ResultWriter(tmp_path)
    for row in rows:
        writer.record(row)
    writer.close()
    assert len(read_jsonl(tmp_path / "result.jsonl")) == len(rows)
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2, files
    starts = [e.step for f in files for e in read_tensorboard_events(f)
              if e.HasField("session_log") and e.session_log.status == SessionLog.START]
    assert starts == [201]


# ---- checkpoint retention ----------------------------------------------------------------
def _fake_checkpoint(parent: Path, iteration: int, score: float | None,
                     attr: str = "episode_reward_mean") -> Path:
    folder = parent / f"checkpoint_{iteration:06d}"
    folder.mkdir(parents=True)
    (folder / STATE_FILE).write_bytes(b"x")
    (folder / METADATA_FILE).write_text(json.dumps({SCORE_KEY: {"attr": attr,
                                                                "value": score}}))
    return folder


def test_retention_keeps_the_newest_and_the_best(tmp_path: Path) -> None:
    """The newest N and the best-scored stay (Tune's ``min-`` prefix: the lowest);
    0 keeps everything."""
    scores = [10.0, 300.0, None, 50.0, 60.0, 70.0, 20.0]
    for i, score in enumerate(scores, 1):
        _fake_checkpoint(tmp_path / "a", i, score)
    deleted = Retention(keep=3).prune(tmp_path / "a")
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == [
        "checkpoint_000002", "checkpoint_000005", "checkpoint_000006", "checkpoint_000007"]
    assert len(deleted) == 3

    for i, score in enumerate(scores, 1):
        _fake_checkpoint(tmp_path / "b", i, score)
    Retention(keep=2, score_attr="min-episode_reward_mean").prune(tmp_path / "b")
    assert [p.name for p in list_checkpoints(tmp_path / "b")] == [
        "checkpoint_000001", "checkpoint_000006", "checkpoint_000007"]

    for i, score in enumerate(scores, 1):
        _fake_checkpoint(tmp_path / "c", i, score)
    assert Retention(keep=0).prune(tmp_path / "c") == []
    assert len(list_checkpoints(tmp_path / "c")) == len(scores)
    assert Retention().score_of({"info": {"x": 2}}) == {"attr": "episode_reward_mean",
                                                        "value": None}
    assert Retention(score_attr="info/x").score_of({"info": {"x": 2}})["value"] == 2.0
    with pytest.raises(ValueError, match="keep"):
        Retention(keep=-1)


# ---- a local run whose learner is killed -------------------------------------------------
def _learner_pid(cli_pid: int) -> int:
    """The learner process below the CLI (actor processes are named ``arl:<name>``)."""
    found = []
    for pid in descendants(cli_pid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "arl:learner":
            found.append(pid)
    assert len(found) == 1, f"learner processes below {cli_pid}: {found}"
    return found[0]


def _results_with(results: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [r for r in results if key in r.get("info", {})]


def _train_and_kill_the_learner(tmp_path: Path, extra: list[str]
                                ) -> tuple[subprocess.Popen, str, str, Path, str]:
    """``actorrl train`` (Ape-X, 1 worker, a checkpoint every iteration, stop at iteration
    9) whose learner is SIGKILLed after the third result; waits for the exit. Returns the
    process, its stdout and stderr, the output folder and the run's process tag."""
    config = tmp_path / "apex.yaml"
    config.write_text("algorithm: apex\ntrain_batch_size: 64\nlearning_starts: 400\n"
                      "min_iter_time_s: 0.5\nstop: {training_iteration: 9}\n")
    output = tmp_path / "results"
    tag = f"restart-{tmp_path.name}"
    proc = start_cli(["train", "--config", str(config), "--num-workers", "1",
                      "--checkpoint-every", "1", "--output", str(output), *extra],
                     tmp_path, tmp_path / "stderr.txt", tag)
    reader = LineReader(proc)
    try:
        reader.wait_for(lambda line: line.startswith("result iter=3 "),
                        FIRST_RESULT_TIMEOUT_S * 2)
        os.kill(_learner_pid(proc.pid), signal.SIGKILL)
        rest = finish(proc, RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    stdout = "\n".join(reader.lines) + "\n" + rest
    return proc, stdout, (tmp_path / "stderr.txt").read_text(), output, tag


@pytest.mark.timeout(600)
def test_a_local_run_over_its_failure_limit_ends_naming_the_limit(tmp_path: Path) -> None:
    """With --max-failures 0 the learner's death ends the run as before (exit 1, status
    failed), with one error line naming what died and the limit."""
    proc, stdout, stderr, output, tag = _train_and_kill_the_learner(
        tmp_path, ["--max-failures", "0"])
    assert proc.returncode == 1, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert_no_process_left(tag)
    [error] = [line for line in stderr.splitlines() if "error:" in line]
    assert "training failed: learner died" in error, stderr
    assert "over the limit (at most 0 failures per 3600 s)" in error, error
    assert "--max-failures" in error and "Traceback" not in stderr
    [run] = run_dirs(output)
    assert json.loads((run / "run.json").read_text())["status"] == "failed"


@pytest.mark.timeout(600)
def test_a_local_run_restarts_its_killed_learner_from_the_last_checkpoint(
        tmp_path: Path) -> None:
    """SIGKILL of the learner of ``actorrl train`` after its third iteration: the run
    restarts the learner from the last checkpoint and trains on to its stop criterion
    (exit 0), where it used to end with "training failed: ... died" (exit 1). Results
    after the restart continue at the checkpoint's next iteration and say so
    (``info.num_restarts``, ``info.restored_iteration``); the run keeps at most the 5
    newest checkpoints and the best; nothing is left running."""
    proc, stdout, stderr, output, tag = _train_and_kill_the_learner(tmp_path, [])
    assert proc.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert "restarted from iteration" in stdout, stdout
    assert_no_process_left(tag)
    [run] = run_dirs(output)
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "finished", status
    results = read_jsonl(run / "result.jsonl")
    after = _results_with(results, "num_restarts")
    assert after, [r["training_iteration"] for r in results]
    restored = after[0]["info"]["restored_iteration"]
    assert 1 <= restored <= results.index(after[0])  # a checkpoint written before the kill
    assert after[0]["training_iteration"] == restored + 1
    assert [r["info"]["num_restarts"] for r in after] == [1] * len(after)
    assert results[-1]["training_iteration"] == 9
    # The curve leaves out what the restart undid; the rows stay in result.jsonl.
    assert [r["training_iteration"] for r in current_results(results)] == list(range(1, 10))
    curve = load_curve(run)
    assert curve.timesteps == sorted(curve.timesteps) and len(curve.timesteps) == 9
    kept = list_checkpoints(run / "checkpoints")
    assert 5 <= len(kept) <= 6, kept


# ---- the local restart loop, on stub trainers ----------------------------------------------
class StubTrainer:
    """Answers ``train()`` from a script: a result, or an exception to raise."""

    def __init__(self, script: list[Any], iteration: int = 0) -> None:
        self.script = list(script)
        self.iteration = iteration
        self.stopped = False
        self.restored: dict[str, Any] | None = None

    async def train(self) -> dict[str, Any]:
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        self.iteration += 1
        return {"training_iteration": self.iteration, "timesteps_total": 100 * self.iteration,
                "info": dict(step)}

    async def set_state(self, state: dict[str, Any]) -> None:
        self.restored = state
        self.iteration = state["iteration"]

    async def stop(self) -> None:
        self.stopped = True


async def test_a_recovering_trainer_restarts_on_actor_deaths_only() -> None:
    """An actor's death restarts from the state source (results then name the restart,
    the iteration rolled back to and the env steps lost, failure counters carried);
    another error propagates at once; over the limit, a RestartLimitError names it."""
    from actorrl.experiment.recovery import RecoveringTrainer, RestartLimitError
    from actorrl.runtime.errors import ActorDiedError

    died = ActorDiedError("ActorHandle(learner #1234abcd @ ipc:///x.sock) at ipc:///x.sock "
                          "died: killed")
    first = StubTrainer([{}, {"num_worker_restarts": 2}, died])
    second = StubTrainer([{"num_worker_restarts": 0}, ValueError("a bug")])
    built = iter([second])
    notes: list[str] = []

    async def rebuild(_survivors: Any = None) -> StubTrainer:
        return next(built)

    async def state() -> dict[str, Any]:
        return {"iteration": 1, "timesteps_total": 100}

    recovering = RecoveringTrainer(
        first, rebuild=rebuild, state=state, notify=notes.append,  # type: ignore[arg-type]
        policy=RestartPolicy(max_failures=1, backoff_initial_s=0))
    assert (await recovering.train())["training_iteration"] == 1
    assert (await recovering.train())["training_iteration"] == 2
    result = await recovering.train()  # iteration 3 fails: back to iteration 1
    assert first.stopped and second.restored == {"iteration": 1, "timesteps_total": 100}
    assert result["training_iteration"] == 2 and result["timesteps_total"] == 200
    assert result["info"] == {"num_worker_restarts": 2, "num_restarts": 1,
                              "restored_iteration": 1, "timesteps_lost": 100,
                              "timesteps_sampled_all": 300}
    assert notes[0].startswith("learner died: killed: failure 1"), notes
    with pytest.raises(ValueError, match="a bug"):
        await recovering.train()

    limited = RecoveringTrainer(
        StubTrainer([died]), rebuild=rebuild, state=state,  # type: ignore[arg-type]
        notify=notes.append, policy=RestartPolicy(max_failures=0))
    with pytest.raises(RestartLimitError, match="learner died: killed .*over the limit"):
        await limited.train()


def test_tune_files_set_retention_and_the_failure_limit(tmp_path: Path) -> None:
    """RLlib's keep_checkpoints_num / checkpoint_score_attr / max_failures are honoured
    (no "ignored" warning); the command line overrides them."""
    import warnings

    from actorrl.experiment.train import plan_training

    path = tmp_path / "tuned.yaml"
    path.write_text("cartpole:\n  run: PPO\n  env: CartPole-v1\n  keep_checkpoints_num: 2\n"
                    "  checkpoint_score_attr: min-episode_len_mean\n  max_failures: -1\n"
                    "  config: {num_workers: 1}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_training(None, config_file=str(path))
    assert plan.retention == Retention(keep=2, score_attr="min-episode_len_mean")
    assert plan.restart_policy.unlimited
    plan = plan_training(None, config_file=str(path), keep_checkpoints=0, max_failures=3,
                         failure_window_s=60.0, failure_window_given=True)
    assert plan.retention.keep == 0 and plan.restart_policy.max_failures == 3
    assert plan.restart_policy.failure_window_s == 60.0
    default = plan_training("ppo")
    assert default.retention == Retention(keep=5, score_attr="episode_reward_mean")
    assert default.restart_policy == RestartPolicy()


# ---- a cluster job under repeated faults -----------------------------------------------------
@pytest.mark.timeout(600)
def test_a_job_survives_spread_out_learner_losses_and_keeps_its_counters(
        tmp_path: Path) -> None:
    """A job allowed one failure per (tiny) window loses a worker, then its learner twice:
    it restarts both times (before, the second learner loss since the job began failed a
    job with max_failures 1), ``num_worker_restarts`` still counts the worker replaced
    before the restarts (before, a restart reset it to 0), and the worker's death is one
    line in the job log (the learner's too: no traceback)."""
    from actorrl.cluster.client import Client
    from tests.test_cluster import APEX_TINY, actor_named, next_result

    with Client.local(num_cpus=4, state_dir=str(tmp_path / "state")) as client:
        job = client.submit({**APEX_TINY, "job": {
            "checkpoint_interval_s": 0, "max_failures": 1, "failure_window_s": 0.001,
            "restart_backoff_s": 0}})
        pids: list[int] = []
        try:
            _, after = next_result(job, 0, lambda r: True, 150)
            worker = actor_named(job, "worker-1")
            pids.append(worker["pid"])
            os.kill(worker["pid"], signal.SIGKILL)
            _, after = next_result(
                job, after, lambda r: r["info"]["num_worker_restarts"] >= 1, 150)
            for loss in (1, 2):
                learner = actor_named(job, "learner")
                pids.append(learner["pid"])
                os.kill(learner["pid"], signal.SIGKILL)
                result, after = next_result(
                    job, after, lambda r, n=loss: r["job"]["num_failures"] >= n, 240)
                assert result["info"]["num_worker_restarts"] >= 1, result["info"]
            assert job.status()["state"] == "running"
            pids += [a["pid"] for a in job.actors()]
            log = job.logs()
        finally:
            job.stop()
    assert log.count("restarting from") >= 2, log
    about_worker = [line for line in log.splitlines() if "worker-1" in line
                    and any(word in line for word in ("died", "failed", "replaced"))]
    assert len(about_worker) == 1, about_worker
    assert "replaced" in about_worker[0] and "Traceback" not in about_worker[0]
    assert "restarting from checkpoint" in log and "within 0.001 s" in log
    # The learner's deaths are faults, not bugs: one line each, no traceback either.
    assert log.count("iteration failed: ") >= 2, log
    assert "Traceback" not in log, log
    assert pids_alive(pids, 30) == []


def test_the_summary_best_is_that_of_the_current_curve() -> None:
    """The run summary's best reward leaves out iterations a rollback undid (the best
    of 1, 2, 3', 4', 5 after a restart from iteration 2), not the lost iteration 4's."""
    from actorrl.experiment.train import RunSummary

    summary = RunSummary()
    for iteration, reward in [(1, 10.0), (2, 50.0), (3, 40.0), (4, 90.0), (3, 20.0),
                              (4, 30.0), (5, 45.0)]:
        summary.observe({"training_iteration": iteration, "episode_reward_mean": reward,
                         "timesteps_total": 100 * iteration})
    assert (summary.best_reward, summary.best_iteration) == (50.0, 2)
    assert summary.last_reward == 45.0 and summary.training_iteration == 5


@pytest.mark.parametrize(("args", "message"), [
    (["--max-failures", "-3"], "--max-failures: must be >= 0"),
    (["--failure-window", "0"], "--failure-window: must be > 0 seconds"),
    (["--keep-checkpoints", "x"], "--keep-checkpoints: expected an integer"),
    (["--address", "tcp://127.0.0.1:9", "--max-failures", "3", "--keep-checkpoints", "2"],
     "--max-failures, --keep-checkpoints apply to local training"),
], ids=["negative-limit", "zero-window", "bad-keep", "with-address"])
def test_bad_restart_and_retention_flags_are_one_message_and_exit_2(
        tmp_path: Path, args: list[str], message: str) -> None:
    """Bad values of the new flags, and the flags with --address (a job has its own
    options), are refused before anything starts."""
    from tests.helpers.cluster import run_cli

    proc = run_cli(["train", "ppo", *args, "--output", str(tmp_path / "results")],
                   cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists()


def test_failure_lines_name_what_died_without_socket_paths() -> None:
    """The one-line form of the errors a fault raises (the job log, the terminal)."""
    from actorrl.runtime.errors import ActorDiedError, ObjectLostError
    from actorrl.util.failures import failure_line
    from transport.errors import RemoteError

    assert failure_line(ActorDiedError(
        "ActorHandle(learner #a614c5e8 @ ipc:///t/x.sock) at ipc:///t/x.sock died: "
        "connection to ipc:///t/x.sock was lost")) == \
        "learner died: connection to ipc:///t/x.sock was lost"
    assert failure_line(ActorDiedError(
        "ActorHandle(worker-1 #8b64aa55 @ ipc:///t/a.sock) died while parked (gone)")) == \
        "worker-1 died while parked (gone)"
    assert failure_line(ObjectLostError(
        "owner of ObjectRef(000000000000 @ ipc:///t/a.sock) at ipc:///t/a.sock died: "
        "actor process 5491 killed by SIGKILL")) == \
        "an object's owner died: actor process 5491 killed by SIGKILL"
    assert failure_line(RemoteError("ValueError", "bad value", "Traceback ...\n  x\n")) == \
        "ValueError: bad value"
    assert failure_line(KeyError("k")) == "KeyError: 'k'"


@pytest.mark.timeout(600)
def test_an_appo_jobs_recovered_worker_deaths_are_one_line_each(tmp_path: Path) -> None:
    """APPO (IMPALA's pipeline) loses each of its two workers in turn: each death is one
    line in the job log. Before, a train batch the learner was fetching from the dead
    worker added a warning with the learner's remote traceback (when one was in flight,
    as it usually is)."""
    from actorrl.cluster.client import Client
    from tests.test_cluster import actor_named, next_result

    with Client.local(num_cpus=4, state_dir=str(tmp_path / "state")) as client:
        job = client.submit({"algorithm": "appo", "num_workers": 2, "num_envs_per_worker": 2,
                             "rollout_fragment_length": 20, "train_batch_size": 80,
                             "min_iter_time_s": 0.5, "job": {"checkpoint_interval_s": 0}})
        pids: list[int] = []
        try:
            _, after = next_result(job, 0, lambda r: True, 150)
            for count, name in enumerate(("worker-1", "worker-2"), 1):
                worker = actor_named(job, name)
                pids.append(worker["pid"])
                os.kill(worker["pid"], signal.SIGKILL)
                _, after = next_result(
                    job, after, lambda r, n=count: r["info"]["num_worker_restarts"] >= n, 150)
            pids += [a["pid"] for a in job.actors()]
            log = job.logs()
        finally:
            job.stop()
    for name in ("worker-1", "worker-2"):
        lines = [line for line in log.splitlines() if name in line and any(
            word in line for word in ("died", "failed", "replaced", "lost"))]
        assert len(lines) == 1 and "replaced" in lines[0], lines
    assert "Traceback" not in log and "lost with a dead worker" not in log, log
    assert pids_alive(pids, 30) == []
