"""The learner's failure paths reach the pipeline step as typed errors naming the cause (a
failed learner thread, a failed loader thread, a killed learner process); ``reset`` swaps
a running pipeline's workers; the Ape-X learner waits for its first batch however long
``learning_starts`` takes."""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import time

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.algorithms.trainer import WORKER_CLASS
from actorrl.config.algorithm import load_config
from actorrl.learner.actor import LearnerError
from actorrl.learner.config import LearnerConfig
from actorrl.learner.minibatch_buffer import LearnerStarvedError, MinibatchBuffer
from actorrl.runtime import ActorDiedError, Driver

DEADLINE_S = 120.0
SHORT_STEPS = {"a3c": {"grads_per_step": 10}}
"""Per algorithm, what keeps one pipeline step short where a test needs steps, not
learning (A3C's default of 100 gradients is ~12,800 env steps a step)."""


async def _train_until_it_raises(trainer: Trainer) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        await trainer.train()
    pytest.fail(f"training did not fail within {DEADLINE_S} s")


async def test_a_failed_learner_thread_fails_the_step_with_a_learner_error(tmp_path):
    """The learner thread's update raises: the next pipeline step raises LearnerError
    naming the learner thread and the original error."""
    spec = dataclasses.replace(get_algorithm("apex"),
                               policy="tests.actors.failing_policies:FailingLearnDQNPolicy")
    config = load_config(spec.config_cls, {"num_workers": 1, "learning_starts": 200,
                                           "min_iter_time_s": 0.5, "seed": 0})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        with pytest.raises(LearnerError, match="the learner thread failed: InjectedFailure"
                                               r"\('injected failure in update 4'\)"):
            await _train_until_it_raises(trainer)
        await trainer.stop()


async def test_a_failed_loader_thread_fails_the_step_with_a_learner_error(tmp_path):
    """IMPALA on two fake-GPU towers: a loader thread's batch loading raises; the next
    pipeline step raises LearnerError naming that loader thread and the error."""
    spec = dataclasses.replace(
        get_algorithm("impala"), policy="tests.actors.failing_policies:FailingLoaderImpalaPolicy")
    config = load_config(spec.config_cls, {"num_workers": 1, "num_gpus": 2,
                                           "_fake_gpus": True, "train_batch_size": 200,
                                           "min_iter_time_s": 0.5, "seed": 0})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        with pytest.raises(LearnerError, match="loader thread 'learner-loader-0' failed: "
                                               "InjectedFailure"):
            await _train_until_it_raises(trainer)
        await trainer.stop()


@pytest.mark.parametrize("algorithm", ["apex", "impala", "a3c", "a2c", "ppo"])
async def test_a_killed_learner_process_fails_the_step_naming_the_learner(algorithm,
                                                                          tmp_path):
    """SIGKILL of the learner process mid-run: the pipeline step raises ActorDiedError
    naming the learner (the trainer's caller decides: the CLI stops, a cluster job resumes
    from its checkpoint)."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"num_workers": 1, "min_iter_time_s": 0.5,
                                           "seed": 0, **SHORT_STEPS.get(algorithm, {})})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        await trainer.train()
        os.kill(driver.node.process_of(trainer.learner).pid, signal.SIGKILL)
        with pytest.raises(ActorDiedError, match="learner"):
            await _train_until_it_raises(trainer)
        await trainer.stop()


@pytest.mark.parametrize("algorithm", ["apex", "impala", "a3c", "a2c"])
async def test_reset_swaps_the_workers_of_a_running_pipeline(algorithm, tmp_path):
    """Mid-run, ``reset`` replaces both workers with a new one: the old ones can then die
    unnoticed (no failure counted), and sampling and training go on with the new one."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"num_workers": 2, "min_iter_time_s": 0.5,
                                           "seed": 0, "learning_starts": 200}
                         if algorithm == "apex" else
                         {"num_workers": 2, "min_iter_time_s": 0.5, "seed": 0,
                          **SHORT_STEPS.get(algorithm, {})})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        await trainer.train()
        new = await driver.create_actor(
            WORKER_CLASS, args=(config.env, spec.policy, trainer.worker_config),
            kwargs={"worker_index": 3, "num_workers": 2}, name="worker-3")
        await trainer.broadcast_learner_weights([new])
        old, trainer.workers = trainer.workers, [new]
        trainer.pipeline.reset([new])
        for worker in old:
            await driver.kill_actor(worker)
        before = await trainer.train()
        deadline = time.monotonic() + DEADLINE_S
        after = await trainer.train()
        while after["num_steps_trained"] <= before["num_steps_trained"] and \
                time.monotonic() < deadline:
            after = await trainer.train()
        await trainer.stop()
    assert trainer.pipeline.workers == [new]
    assert after["num_healthy_workers"] == 1
    assert after["info"].get("num_worker_failures", 0) == 0
    assert after["timesteps_total"] > before["timesteps_total"]
    assert after["num_steps_trained"] > before["num_steps_trained"]


def test_apex_learner_waits_for_its_first_batch_without_limit():
    """Ape-X's learner config waits for the first batch without limit; after it, the
    learner_queue_timeout applies (and IMPALA's learner applies it from the start)."""
    apex = get_algorithm("apex")
    learner = apex.learner_config(load_config(apex.config_cls,
                                              {"learner_queue_timeout": 0.2}))
    assert learner.wait_for_first_batch
    impala = get_algorithm("impala")
    assert not impala.learner_config(load_config(impala.config_cls, {})).wait_for_first_batch

    inqueue: queue.Queue = queue.Queue()
    buffer = MinibatchBuffer(inqueue, 1, learner.learner_queue_timeout, 1, wait_for_first=True)
    # A first batch long after the timeout (put by a timer thread) still arrives.
    import threading
    threading.Timer(1.0, inqueue.put, args=("first",)).start()
    assert buffer.get() == ("first", True)
    with pytest.raises(LearnerStarvedError, match="learner_queue_timeout"):
        buffer.get()
    assert LearnerConfig(learner_queue_timeout=0.2).wait_for_first_batch is False


async def test_apex_with_a_short_timeout_waits_for_a_slow_learning_start(tmp_path):
    """The user's case: a short learner_queue_timeout (1 s) with replay reaching
    learning_starts only after longer; the run trains instead of failing with
    LearnerStarvedError."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {
        "num_workers": 1, "learner_queue_timeout": 1.0, "learning_starts": 30000,
        "num_envs_per_worker": 1, "rollout_fragment_length": 4, "training_intensity": None,
        "min_iter_time_s": 0.0, "seed": 0})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        started = time.monotonic()
        result = await trainer.train()
        while result["num_steps_trained"] == 0 and time.monotonic() - started < DEADLINE_S:
            result = await trainer.train()
        waited = time.monotonic() - started
        await trainer.stop()
    assert result["num_steps_trained"] > 0
    # replay took longer than learner_queue_timeout to start: 7,500 sampled fragments of 4
    # single-env steps do not reach the learner within 1 s (about 10 s here)
    assert waited > 1.0


RECOVERY_ITERATIONS = 30
"""Most iterations (of 200 env steps each) a recovery may take: a bound in steps, met long
before by a replacement that works."""


async def test_apex_keeps_training_when_a_worker_and_the_shard_are_killed(tmp_path):
    """SIGKILL of a rollout worker mid-run: the failure is reported, the worker replaced,
    results keep coming and the sampled step count keeps growing. Then SIGKILL of the
    replay shard: an empty shard takes its place and training goes on. Iterations are
    bounded by env steps (200 each), and each recovery by a number of them."""
    from tests.helpers.procs import pids_alive

    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0, "min_iter_time_s": 0,
                                           "timesteps_per_iteration": 200,
                                           "learning_starts": 400})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        first = await trainer.train()
        victim = trainer.workers[0]
        process = driver.node.process_of(victim)
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        results = []
        for _ in range(RECOVERY_ITERATIONS):  # until the replacement samples
            results.append(await trainer.train())
            info = results[-1]["info"]
            if (len(results) >= 2 and info["num_worker_restarts"] >= 1
                    and results[-1]["num_healthy_workers"] == 2):
                break
        last = results[-1]
        assert last["info"]["num_worker_failures"] >= 1
        assert last["info"]["num_worker_restarts"] >= 1
        assert last["num_healthy_workers"] == 2
        assert victim not in trainer.workers
        steps = [first["timesteps_total"]] + [r["timesteps_total"] for r in results]
        assert steps == sorted(steps) and steps[-1] > steps[1], steps

        shard = trainer.learner_side_actors[0]
        os.kill(driver.node.process_of(shard).pid, signal.SIGKILL)
        after = []
        for _ in range(RECOVERY_ITERATIONS):  # until the learner trains on the new shard
            after.append(await trainer.train())
            if (len(after) >= 2 and after[-1]["info"]["num_shard_failures"] == 1
                    and after[-1]["num_steps_trained"] > last["num_steps_trained"]):
                break
        assert after[-1]["info"]["num_shard_failures"] == 1
        assert shard not in trainer.learner_side_actors
        assert after[-1]["num_steps_trained"] > last["num_steps_trained"]
        assert after[-1]["timesteps_total"] > last["timesteps_total"]
        assert "policy_default_policy" in after[-1]["info"]["replay_shard_0"]
        pids = [running.process.pid for running in driver.node.actors.values()]
        await trainer.stop()
    assert pids_alive(pids, timeout_s=15) == []
