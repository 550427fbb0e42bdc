"""Pipeline stats checked against the wall clock, and Ape-X's handling of a worker whose
``sample`` raises (RLlib counts and re-dispatches the healthy workers' samples of that
step first, then raises). Real actor processes on loopback."""

from __future__ import annotations

import asyncio
import time

import pytest

from actorrl.algorithms.a3c import A3CConfig
from actorrl.pipelines.a3c import AsyncGradientsOptimizer
from actorrl.pipelines.apex import SAMPLE_QUEUE_DEPTH, AsyncReplayOptimizer
from actorrl.pipelines.pieces import RateWindow
from actorrl.replay.config import ReplayConfig
from actorrl.runtime import Driver
from tests.actors.failing import SampleFailure
from tests.actors.scripted import SlowApplyLearnerActor
from tests.helpers.configs import DQN, DQN_CONFIG, a3c_actors


async def _apex(driver, workers, training_intensity=None):
    shard = await driver.create_actor("tests.actors.scripted:RecordingReplayActor",
                                      args=(ReplayConfig(learning_starts=64,
                                                         buffer_size=10_000).to_dict(),),
                                      num_cpus=0)
    learner = await driver.create_actor(
        "actorrl.learner.actor:LearnerActor",
        args=("CartPole-v1", DQN, DQN_CONFIG, {"train_batch_size": 32,
                                                "learner_queue_size": 4}))
    return AsyncReplayOptimizer(driver.runtime, workers, [shard], learner,
                                learner_queue_size=4, training_intensity=training_intensity,
                                max_weight_sync_delay=400)


class FakeClock:
    """A clock the test sets: the seconds a pipeline's rate windows read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_window_counts_idle_time_and_forgets_old_points():
    """Units per second of the clock's time from the window's base point to the latest
    one, idle stretches included; points older than ``window_s`` drop out, one kept at or
    before the window's start as the base."""
    clock = FakeClock()
    rate = RateWindow(window_s=10.0, clock=clock)
    assert rate.rate == 0.0
    clock.now = 2.0
    rate.add(100)
    assert rate.rate == pytest.approx(50.0)
    clock.now = 10.0  # 8 idle seconds
    rate.add(0)
    assert rate.rate == pytest.approx(10.0)
    clock.now = 25.0
    rate.add(150)  # the base is now the point at 10 s (0 at 2 s dropped)
    assert rate.rate == pytest.approx(150 / 15)


@pytest.mark.parametrize("training_intensity", [None, 2.0])
async def test_apex_throughputs_are_rates_over_the_pipelines_clock(tmp_path,
                                                                   training_intensity):
    """``sample_throughput`` and ``train_throughput`` are the env steps the steps counted
    per second of the pipeline's clock, idle waits included (a fake clock here, so the
    check is exact on any machine); under ``training_intensity`` pacing sampling still
    reads a positive rate."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        workers = [await driver.create_actor("tests.actors.scripted:ScriptedWorker",
                                             args=(64, i)) for i in range(2)]
        pipeline = await _apex(driver, workers, training_intensity)
        clock = FakeClock()
        pipeline.sample_rate = RateWindow(clock=clock)
        pipeline.train_rate = RateWindow(clock=clock)
        sampled, trained = pipeline.num_steps_sampled, pipeline.num_steps_trained
        deadline = time.monotonic() + 120  # a slow machine's learner may start late
        while pipeline.num_steps_trained == trained and time.monotonic() < deadline:
            await pipeline.step(timeout_s=0.2)
        assert pipeline.num_steps_trained > trained, "the learner never trained"
        clock.now = 4.0  # the seconds all those steps took, as the pipeline's clock says
        await pipeline.step(timeout_s=0.2)
        stats = await pipeline.stats()
        sampled_rate = (pipeline.num_steps_sampled - sampled) / 4.0
        trained_rate = (pipeline.num_steps_trained - trained) / 4.0
        assert stats["sample_throughput"] > 0
        assert stats["sample_throughput"] == pytest.approx(sampled_rate, abs=1e-3)
        assert stats["train_throughput"] == pytest.approx(trained_rate, abs=1e-3)
        await pipeline.stop()


async def test_a3c_apply_time_is_the_learners_apply(tmp_path):
    """``apply_time_ms`` is the learner's time to apply one gradient: with a learner whose
    applies take at least 50 ms each (``SlowApplyLearnerActor``), it reports at least that
    (timing only the request's send, as the stat once did, gives ~1 ms), and no more than
    the step's wall time allows for ``grads_per_step`` serialized applies. Lower bounds
    only: load can lengthen an apply, never shorten it."""
    floor_ms = 1000 * SlowApplyLearnerActor.APPLY_FLOOR_S
    config = {**A3CConfig().to_dict(), "num_envs_per_worker": 1, "rollout_fragment_length": 10}
    async with Driver.start(str(tmp_path / "s")) as driver:
        workers, learner = await a3c_actors(
            driver, config, 10, learner_class="tests.actors.scripted:SlowApplyLearnerActor")
        pipeline = AsyncGradientsOptimizer(driver.runtime, workers, learner, grads_per_step=6)
        await pipeline.step()  # warm-up
        started = time.perf_counter()
        await pipeline.step()
        step_ms = 1000 * (time.perf_counter() - started)
        stats = await pipeline.stats()
        await pipeline.stop()
    apply_ms = stats["apply_time_ms"]
    assert apply_ms >= floor_ms, (apply_ms, floor_ms)
    assert 6 * floor_ms <= step_ms, (floor_ms, step_ms)  # the applies are serialized
    assert 6 * apply_ms * 0.5 <= step_ms, (apply_ms, step_ms)  # the mean of 2 steps


async def test_apex_counts_and_redispatches_healthy_samples_before_raising(tmp_path):
    """A worker's ``sample`` raising (the actor alive) fails the step, but only after the
    healthy workers' finished samples of that step were counted and re-requested: every
    sample the healthy worker produced is either counted or still pending."""
    async with Driver.start(str(tmp_path / "s")) as driver:
        healthy = await driver.create_actor("tests.actors.scripted:ScriptedWorker",
                                            args=(64, 0))
        raising = await driver.create_actor("tests.actors.failing:RaisingWorker",
                                            args=(64, 1, 1))
        pipeline = await _apex(driver, [healthy, raising])

        async def until_raised() -> BaseException:
            while True:
                try:
                    await pipeline.step(timeout_s=0.2)
                except Exception as exc:  # noqa: BLE001 - the failure under test
                    return exc

        error = await asyncio.wait_for(until_raised(), 60)
        assert isinstance(error, SampleFailure), repr(error)  # typed across the wire
        assert "scripted failure of sample 1" in str(error)
        pending = pipeline.sample_tasks.count_for(healthy)
        assert pending == SAMPLE_QUEUE_DEPTH, "the healthy worker was not re-dispatched"
        # A worker runs calls in order: a record comes after every pending sample. Every
        # sample that came back (the raising worker's others too) was counted.
        done = 0
        for worker, failed in ((healthy, 0), (raising, 1)):
            record = await driver.get(worker.record.remote(), timeout_s=30)
            done += record["samples"] - pipeline.sample_tasks.count_for(worker) - failed
        assert pipeline.num_steps_sampled == 64 * done
        await pipeline.stop()
