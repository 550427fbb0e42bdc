"""Lose little (issue 45 item 2): checkpoints written without pausing training, a default
interval short enough that a learner loss rolls back about 10 s of training, and replay
shards (and rollout workers) that survive a learner restart when their processes are alive.

Runs are real (in this process, actors as processes or serial), every wait bounded by
results or events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

import actorrl.experiment.train as train_module
from actorrl.algorithms import Trainer, get_algorithm
from actorrl.algorithms.checkpoints import list_checkpoints, read_checkpoint
from actorrl.algorithms.restarts import RestartPolicy
from actorrl.config.algorithm import load_config
from actorrl.experiment.progress import PlainProgress
from actorrl.experiment.recovery import RecoveringTrainer
from actorrl.experiment.results import RunDirectory
from actorrl.experiment.train import ConfigFile, LocalRun, plan_training
from actorrl.runtime import Driver
from tests.helpers.procs import descendants

WRITE_BLOCK_S = 60.0
"""How long the blocked checkpoint write waits for training to go on without it (on code
that awaits the write, training never goes on: the test then fails after this long)."""


def _tiny_ppo_plan(tmp_path: Path, **kwargs: Any) -> Any:
    file = ConfigFile(path="tiny-ppo", algorithm="ppo", values={
        "env": "CartPole-v1", "num_workers": 1, "train_batch_size": 128,
        "sgd_minibatch_size": 64, "num_sgd_iter": 1, "min_iter_time_s": 0},
        stop={"training_iteration": 6})
    return plan_training(None, config_file=file, output_dir=str(tmp_path / "results"),
                         serial=True, **kwargs)


# ---- checkpoints in the background -------------------------------------------------------
@pytest.mark.timeout(180)
async def test_training_goes_on_while_a_checkpoint_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint every iteration whose first write blocks: the run trains on (three
    more results arrive while the write is held), then the write completes, later
    checkpoints follow one at a time, and the run ends with its final checkpoint on disk,
    loadable. Before: the run loop awaited the write, so no result came while it was held."""
    released = threading.Event()
    first_written = threading.Event()
    writing = threading.Lock()
    overlapping: list[int] = []
    real_write = train_module.write_checkpoint
    calls: list[int] = []

    def slow_write(parent: Any, state: dict[str, Any], metadata: dict[str, Any]) -> Path:
        if not writing.acquire(blocking=False):
            overlapping.append(int(state["iteration"]))
            writing.acquire()
        try:
            calls.append(int(state["iteration"]))
            if len(calls) == 1:
                released.wait(WRITE_BLOCK_S)
                try:
                    return real_write(parent, state, metadata)
                finally:
                    first_written.set()
            return real_write(parent, state, metadata)
        finally:
            writing.release()

    monkeypatch.setattr(train_module, "write_checkpoint", slow_write)
    plan = _tiny_ppo_plan(tmp_path, checkpoint_every=1)
    seen_while_blocked: list[int] = []

    class Watching(LocalRun):
        def _record(self, result: dict[str, Any]) -> None:
            super()._record(result)
            if calls and not first_written.is_set():
                seen_while_blocked.append(int(result["training_iteration"]))
                if len(seen_while_blocked) >= 3:
                    released.set()

    run_dir = RunDirectory.create(plan.output_dir, plan.spec.name, plan.config.env)
    summary = await Watching(plan, run_dir, PlainProgress(io.StringIO())).run()
    released.set()
    assert summary.status == "finished", summary
    assert len(seen_while_blocked) >= 3, (
        f"no training while the first checkpoint was written: results during the write "
        f"{seen_while_blocked}, writes {calls}")
    assert not overlapping, f"writes overlapped: {overlapping}"
    kept = list_checkpoints(run_dir.checkpoints_dir)
    assert kept and kept[-1].name == "checkpoint_000006", kept
    _, state = read_checkpoint(kept[-1])
    assert state["iteration"] == 6
    assert summary.last_checkpoint == str(kept[-1])
    assert not [p for p in run_dir.checkpoints_dir.iterdir() if p.name.startswith(".")]


# ---- the default interval ----------------------------------------------------------------
def test_the_default_checkpoint_interval_is_10_s_of_training(tmp_path: Path) -> None:
    """Without --checkpoint-every a run checkpoints after its first iteration and then
    whenever 10 s have passed, so a learner loss rolls back at most about 10 s (plus one
    iteration); --checkpoint-every N keeps checkpointing every N iterations."""
    from actorrl.cli.main import build_parser

    plan = _tiny_ppo_plan(tmp_path)
    assert plan.checkpoint_every is None and plan.checkpoint_interval_s == 10.0
    policy = train_module.checkpoint_policy(plan, save=_no_save)
    assert policy.every_s == 10.0
    assert policy.due(1, float("inf")) and not policy.due(2, 9.9) and policy.due(3, 10.0)
    by_iterations = train_module.checkpoint_policy(
        _tiny_ppo_plan(tmp_path, checkpoint_every=3), save=_no_save)
    assert by_iterations.every_s is None and by_iterations.due(3, 0.0)
    assert not by_iterations.due(4, 100.0)
    args = build_parser().parse_args(["train", "ppo"])
    assert args.checkpoint_every is None and args.checkpoint_interval == 10.0
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "--checkpoint-interval" in help_text and "10 s" in " ".join(help_text.split())
    from actorrl.cluster.jobs import JobOptions

    assert JobOptions().checkpoint_interval_s == 10.0  # cluster jobs: was 30 s


async def _no_save(final: bool) -> None:
    """A save that saves nothing (for building checkpoint policies)."""


# ---- replay shards survive a learner restart -----------------------------------------------
def _learner_pid() -> int:
    """This process's learner actor process (actor processes are named ``arl:<name>``)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "arl:learner":
                found.append(pid)
        except OSError:
            continue
    assert len(found) == 1, f"learner processes: {found}"
    return found[0]


def _replay_added(result: dict[str, Any]) -> int:
    return int(result["info"]["replay_shard_0"]["num_added"])


@pytest.mark.timeout(240)
async def test_a_learner_restart_keeps_the_live_replay_shards_and_workers(
        tmp_path: Path) -> None:
    """SIGKILL of an Ape-X run's learner: the restart replaces the learner only. The
    replay shard keeps its rows (its count goes on from where it was, not from 0), the
    rollout workers are the same processes, and learning resumes at once: rows are trained
    again before another ``learning_starts`` env steps were sampled. Before: every actor
    was stopped and started afresh, the shard empty, learning waiting for
    ``learning_starts`` new steps."""
    spec = get_algorithm("apex")
    learning_starts = 3000
    config = load_config(spec.config_cls, {
        "env": "CartPole-v1", "num_workers": 1, "train_batch_size": 32,
        "learning_starts": learning_starts, "num_replay_buffer_shards": 1,
        "timesteps_per_iteration": 200, "min_iter_time_s": 0, "seed": 0})
    notes: list[str] = []
    async with Driver.start(str(tmp_path / "s")) as driver:
        async def rebuild(survivors: Any = None) -> Trainer:
            kept = {"survivors": survivors} if survivors is not None else {}
            return await Trainer.create(spec, config, driver, **kept)

        trainer = await Trainer.create(spec, config, driver)
        snapshot: dict[str, Any] = {}

        async def state() -> dict[str, Any]:
            return snapshot["state"]

        recovering = RecoveringTrainer(trainer, rebuild=rebuild, state=state,
                                       policy=RestartPolicy(backoff_initial_s=0),
                                       notify=notes.append)
        try:
            result = await recovering.train()
            while result["num_steps_trained"] == 0:  # until learning started
                result = await recovering.train()
            snapshot["state"] = await trainer.get_state()
            result = await recovering.train()
            added_before = _replay_added(result)
            assert added_before >= learning_starts
            workers_before = list(trainer.workers)
            shards_before = list(trainer.learner_side_actors)
            os.kill(_learner_pid(), signal.SIGKILL)
            result = await recovering.train()  # fails, restarts, trains an iteration
            assert recovering.num_restarts == 1, notes
            new = recovering.trainer
            assert new is not None and new is not trainer
            assert new.learner_side_actors == shards_before
            assert new.workers == workers_before
            assert _replay_added(result) > added_before, result["info"]["replay_shard_0"]
            sampled_after = new.pipeline.num_steps_sampled  # type: ignore[union-attr]
            trained_from = snapshot["state"]["num_steps_trained"]
            while result["num_steps_trained"] <= trained_from:
                assert sampled_after < learning_starts, (
                    "learning waited for learning_starts again after the restart")
                result = await recovering.train()
                sampled_after = new.pipeline.num_steps_sampled  # type: ignore[union-attr]
            assert sampled_after < learning_starts
        finally:
            await recovering.stop()
            await asyncio.sleep(0)


async def test_the_background_writer_writes_one_at_a_time_the_newest_winning() -> None:
    """Writes run in a thread one after another; a state submitted while another waits
    replaces it (superseded); ``on_done`` runs on the loop; a failed write is counted and
    training goes on, and :meth:`flush` raises it when it was the last."""
    from actorrl.algorithms.checkpoints import BackgroundWriter

    writer = BackgroundWriter()
    gate, started = threading.Event(), threading.Event()
    written: list[int] = []
    done: list[int] = []
    loop_thread = threading.get_ident()

    def write(n: int) -> Any:
        def run() -> int:
            if n == 1:
                started.set()
                gate.wait(30)
            assert threading.get_ident() != loop_thread
            written.append(n)
            return n
        return run

    def on_done(n: int) -> None:
        assert threading.get_ident() == loop_thread
        done.append(n)

    writer.submit(write(1), on_done)
    assert await asyncio.to_thread(started.wait, 30)  # the first write is under way
    for n in (2, 3):
        writer.submit(write(n), on_done)
    assert writer.busy and written == []  # submit never waits for the disk
    gate.set()
    await writer.flush()
    assert written == [1, 3] and done == [1, 3]
    assert (writer.stats.written, writer.stats.superseded) == (2, 1)

    def broken() -> None:
        raise OSError(28, "No space left on device")

    writer.submit(broken)
    with pytest.raises(OSError, match="No space left"):
        await writer.flush()
    assert writer.stats.failed == 1
    writer.submit(write(4), on_done)
    await writer.flush()  # a later success clears the error
    assert done == [1, 3, 4]
