"""Pipeline semantics with scripted workers (fixed sample sizes, a learner whose queue can
be filled), in both modes: on real actor processes, and serial (every actor in the test's
process and event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest

from actorrl.algorithms.a2c import A2CConfig
from actorrl.algorithms.a3c import A3CConfig
from actorrl.config.sections import ConfigError
from actorrl.data.batch import SampleBatch
from actorrl.learner.actor import LearnerActor
from actorrl.pipelines.a3c import AsyncGradientsOptimizer
from actorrl.pipelines.apex import AsyncReplayOptimizer
from actorrl.pipelines.impala import AsyncSamplesOptimizer
from actorrl.pipelines.microbatch import MicrobatchOptimizer
from actorrl.replay.config import ReplayConfig
from actorrl.rollout import RolloutWorker
from actorrl.runtime import Driver
from tests.helpers.configs import AC, APEX_PIPELINE, DQN, DQN_CONFIG, IMPALA_PIPELINE, a3c_actors


@pytest.fixture(params=[False, True], ids=["processes", "serial"])
def serial(request) -> bool:
    """Run the test on actor processes, then in serial mode."""
    return request.param




async def _until(predicate, pipeline, timeout_s: float = 60.0) -> None:
    """Step the pipeline until ``predicate()`` holds; fail after ``timeout_s``."""
    async def loop():
        while not predicate():
            await pipeline.step(timeout_s=0.5)
    await asyncio.wait_for(loop(), timeout_s)


async def _learner(driver, queue_size: int = 16, start_thread: bool = True):
    return await driver.create_actor(
        "actorrl.learner.actor:LearnerActor",
        args=("CartPole-v1", DQN, DQN_CONFIG,
              {"train_batch_size": 32, "learner_queue_size": queue_size}),
        kwargs={"start_thread": start_thread})


async def _shard(driver, cls="tests.actors.scripted:RecordingReplayActor", starts=0, seed=0):
    replay = ReplayConfig(learning_starts=starts, buffer_size=10_000, train_batch_size=32)
    return await driver.create_actor(cls, args=(replay.to_dict(),),
                                     kwargs={"seed": seed}, num_cpus=0)


async def test_apex_syncs_weights_exactly_when_the_delay_is_crossed(tmp_path, serial):
    """With 100-row samples and max_weight_sync_delay=250, a worker gets weights after its
    3rd, 6th, 9th... sample: num_weight_syncs == sum over workers of samples // 3."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        workers = [await driver.create_actor("tests.actors.scripted:ScriptedWorker",
                                             args=(100, i)) for i in range(2)]
        shard = await _shard(driver, starts=10**9)  # never replays: weights only
        learner = await _learner(driver)
        pipeline = AsyncReplayOptimizer(driver.runtime, workers, [shard], learner,
                                        learner_queue_size=16, max_weight_sync_delay=250)
        await _until(lambda: pipeline.num_steps_sampled >= 3000, pipeline)
        processed = pipeline.num_steps_sampled // 100
        assert pipeline.num_weight_syncs >= 2
        records = await driver.get([w.record.remote() for w in workers], timeout_s=30)
        synced = sum(len(r["weight_syncs"]) for r in records)
        assert synced == pipeline.num_weight_syncs
        for record in records:
            # Each sync was sent right after the worker's 3rd, 6th, ... sample came back;
            # the worker had already been asked for up to 2 more (SAMPLE_QUEUE_DEPTH).
            for k, samples_before in enumerate(record["weight_syncs"], start=1):
                assert 3 * k <= samples_before <= 3 * k + 2
        assert pipeline.num_weight_syncs <= processed // 3
        await pipeline.stop()


async def test_apex_replays_only_what_the_learner_has_room_for(tmp_path, serial):
    """A learner that never dequeues (no learner thread) fills its in-queue to exactly
    learner_queue_size; the credit window (queue + the batch in training) lets at most one
    more replay be requested, so at most one is dropped, no replay stays in flight, and
    the learner-stall gauge keeps growing with the wall clock while nothing is dropped."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        worker = await driver.create_actor("tests.actors.scripted:ScriptedWorker", args=(64,))
        shard = await _shard(driver, starts=64)
        learner = await _learner(driver, queue_size=2, start_thread=False)
        started = time.perf_counter()
        pipeline = AsyncReplayOptimizer(driver.runtime, [worker], [shard], learner,
                                        learner_queue_size=2, max_weight_sync_delay=400)
        sizes = []

        async def fill() -> None:
            while not sizes or sizes[-1] < 2:
                await pipeline.step(timeout_s=0.2)
                sizes.append(await driver.get(learner.queue_size.remote(), timeout_s=30))

        await asyncio.wait_for(fill(), 60)

        async def quiet() -> None:  # the replays in flight come back and are not renewed
            while pipeline.replay_tasks.count or pipeline.learner_tasks.count > 1:
                await pipeline.step(timeout_s=0.2)

        await asyncio.wait_for(quiet(), 30)
        stalled_from = time.perf_counter()
        for _ in range(5):
            await pipeline.step(timeout_s=0.2)
        waited_s = time.perf_counter() - stalled_from
        assert max(sizes) == 2, "the learner's in-queue must hold exactly its bound"
        assert pipeline.num_steps_trained == 0
        assert pipeline.replay_tasks.count == 0, "replays kept coming for a full learner"
        assert pipeline.num_samples_dropped <= 1
        assert pipeline.credits.in_use == pipeline.credits.size == 3
        stats = await pipeline.stats()
        assert stats["learner_stall_s"] >= waited_s
        assert stats["learner_stall_s"] <= time.perf_counter() - started
        assert stats["num_samples_dropped"] == pipeline.num_samples_dropped
        stats = await driver.get(shard.stats.remote(), timeout_s=30)
        assert stats["num_added"] > 0


async def test_apex_sends_priorities_back_to_the_shard_that_replayed(tmp_path, serial):
    """Every priority update a shard receives is for a batch that same shard replayed."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        workers = [await driver.create_actor("tests.actors.scripted:ScriptedWorker",
                                             args=(64, i)) for i in range(2)]
        shards = [await _shard(driver, starts=128, seed=i) for i in range(2)]
        learner = await _learner(driver)
        pipeline = AsyncReplayOptimizer(driver.runtime, workers, shards, learner, seed=0,
                                        **APEX_PIPELINE)
        await _until(lambda: pipeline.num_steps_trained >= 32 * 30, pipeline, timeout_s=120)
        await pipeline.stop()
        records = await driver.get([s.record.remote() for s in shards], timeout_s=30)
        for record in records:
            served = set(record["served"])
            assert record["updates"], "a shard got no priority update"
            assert all(update in served for update in record["updates"])
        stats = await pipeline.stats()
        assert {"sample_throughput", "train_throughput", "num_weight_syncs",
                "num_samples_dropped", "learner_queue", "replay_shard_0"} <= set(stats)
        assert {"add_batch_time_ms", "replay_time_ms", "update_priorities_time_ms"} <= set(
            stats["replay_shard_0"])


async def test_apex_debug_stats(tmp_path, serial):
    """With debug, stats carry timing_breakdown and pending task counts (2 per worker,
    4 per shard)."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        worker = await driver.create_actor("tests.actors.scripted:ScriptedWorker", args=(64,))
        shard = await _shard(driver, starts=10**9)
        learner = await _learner(driver)
        pipeline = AsyncReplayOptimizer(driver.runtime, [worker], [shard], learner, debug=True,
                                        **APEX_PIPELINE)
        await pipeline.step(timeout_s=0.5)
        stats = await pipeline.stats()
        assert stats["pending_sample_tasks"] == 2
        assert stats["pending_replay_tasks"] == 4
        assert "learner_grad_time_ms" in stats["timing_breakdown"]


def test_microbatch_accumulation_equals_the_full_batch_gradient():
    """Gradients accumulated over uneven microbatches and applied once (count-weighted)
    give exactly the parameters of one update on the whole batch."""
    config = {**A2CConfig().to_dict(), "num_envs_per_worker": 4, "seed": 1,
              "model": {"fcnet_hiddens": [16, 16]}}
    sampler = RolloutWorker("CartPole-v1", AC, config)
    batches = [sampler.sample() for _ in range(3)]
    batches[1] = batches[1].slice(0, 17)  # uneven sizes
    full = SampleBatch.concat_samples(batches)
    learner = LearnerActor("CartPole-v1", AC, config, {"train_batch_size": 64},
                           start_thread=False)
    reference = RolloutWorker("CartPole-v1", AC, config)
    reference.set_weights(learner.worker.get_weights())
    for batch in batches:
        learner.accumulate_gradients([batch])
    result = learner.apply_accumulated_gradients()
    assert result["rows"]["default_policy"] == full.count
    grads, _ = reference.compute_gradients(full)
    reference.apply_gradients(grads)
    ours = learner.worker.get_weights()["default_policy"]
    theirs = reference.get_weights()["default_policy"]
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6)


async def test_microbatch_pipeline_step_counts(tmp_path, serial):
    """One step samples until train_batch_size in microbatches and trains on all of it;
    a microbatch larger than the train batch is refused; the config's microbatch_size of
    null or at least train_batch_size is one gradient of the whole batch (RLlib's A2C)."""
    with pytest.raises(ValueError, match="must be at most the train batch size"):
        MicrobatchOptimizer(None, ["w"], "l", train_batch_size=100, microbatch_size=101)
    with pytest.raises(ConfigError, match="microbatch_size must be >= 1 or null, got 0"):
        A2CConfig(train_batch_size=64, microbatch_size=0)
    assert A2CConfig(train_batch_size=64, microbatch_size=256).effective_microbatch_size() == 64
    assert A2CConfig(train_batch_size=64, microbatch_size=None).effective_microbatch_size() == 64
    assert A2CConfig(train_batch_size=64, microbatch_size=16).effective_microbatch_size() == 16
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        config = {**A2CConfig().to_dict(), "num_envs_per_worker": 2,
                  "rollout_fragment_length": 25}
        workers = [await driver.create_actor(
            "actorrl.rollout.actor:RolloutWorkerActor", args=("CartPole-v1", AC, config),
            kwargs={"worker_index": i + 1}) for i in range(2)]
        learner = await driver.create_actor(
            "actorrl.learner.actor:LearnerActor", args=("CartPole-v1", AC, config,
                                                        {"train_batch_size": 300}),
            kwargs={"start_thread": False})
        pipeline = MicrobatchOptimizer(driver.runtime, workers, learner, train_batch_size=300,
                                       microbatch_size=100)
        before = (await driver.get(learner.get_weights.remote()))["version"]
        await pipeline.step()
        after = (await driver.get(learner.get_weights.remote()))["version"]
        assert after == before + 1, "exactly one update per step"
        assert pipeline.num_steps_sampled == 300  # 3 microbatches of 2 x 50 rows
        stats = await pipeline.stats()
        assert {"sample_time_ms", "grad_time_ms", "update_time_ms", "opt_peak_throughput",
                "sample_peak_throughput", "opt_samples", "learner"} <= set(stats)


def test_a3c_needs_a_remote_worker():
    """A3C with zero remote workers is a clear error (config and optimizer)."""
    with pytest.raises(ValueError, match="at least 1 remote worker"):
        AsyncGradientsOptimizer(None, [], "learner", grads_per_step=1)
    with pytest.raises(ConfigError, match="num_workers >= 1"):
        A3CConfig(num_workers=0)


async def test_a3c_applies_grads_per_step_gradients(tmp_path, serial):
    """One A3C step applies exactly grads_per_step gradients at the learner."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        config = {**A3CConfig().to_dict(), "num_envs_per_worker": 2,
                  "rollout_fragment_length": 10}
        workers, learner = await a3c_actors(driver, config, 20)
        pipeline = AsyncGradientsOptimizer(driver.runtime, workers, learner, grads_per_step=7)
        before = (await driver.get(learner.get_weights.remote()))["version"]
        await pipeline.step()
        after = (await driver.get(learner.get_weights.remote()))["version"]
        assert after - before == 7
        assert pipeline.num_steps_sampled == 7 * 20
        stats = await pipeline.stats()
        assert {"wait_time_ms", "apply_time_ms", "dispatch_time_ms", "learner"} <= set(stats)


async def test_apex_paced_sampling_refills_a_replaced_shard(tmp_path, serial):
    """With training_intensity pacing the samplers wait on the learner; when the only shard
    is SIGKILLed the learner has nothing left to replay, so sampling must run unpaced
    until the empty replacement can replay again, and training must resume."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        worker = await driver.create_actor("tests.actors.scripted:ScriptedWorker", args=(64,))
        shard = await _shard(driver, starts=256)
        learner = await _learner(driver)
        replacements = []

        async def replace_shard(old):
            new = await _shard(driver, starts=256, seed=1)
            replacements.append(new)
            return new

        pipeline = AsyncReplayOptimizer(driver.runtime, [worker], [shard], learner,
                                        learning_starts=256, training_intensity=8.0,
                                        replace_shard=replace_shard, **APEX_PIPELINE)
        await _until(lambda: pipeline.num_steps_trained >= 32 * 20, pipeline, timeout_s=120)
        assert pipeline.pacer.parked, "pacing should hold the sampler back at this intensity"
        driver.node.kill_actor(shard)  # SIGKILL (serial: dropped as if)
        await _until(lambda: replacements, pipeline)
        trained_at_replacement = pipeline.num_steps_trained
        await _until(lambda: pipeline.num_steps_trained >= trained_at_replacement + 32 * 20,
                     pipeline, timeout_s=120)
        stats = await driver.get(replacements[0].stats.remote(), timeout_s=30)
        assert stats["num_added"] >= 256
        assert pipeline.num_shard_failures == 1
        await pipeline.stop()


async def test_a3c_worker_gets_weights_that_include_its_own_gradient(tmp_path, serial):
    """RLlib's order: a worker's gradient is applied, then that worker gets the weights.
    With one worker, the k-th weights it receives carry version k (k gradients applied)."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        config = {**A3CConfig().to_dict(), "num_envs_per_worker": 2,
                  "rollout_fragment_length": 10}
        worker = await driver.create_actor("tests.actors.scripted:VersionRecordingWorker",
                                           args=("CartPole-v1", AC, config),
                                           kwargs={"worker_index": 1})
        learner = await driver.create_actor(
            "actorrl.learner.actor:LearnerActor",
            args=("CartPole-v1", AC, config, {"train_batch_size": 20}),
            kwargs={"start_thread": False})
        pipeline = AsyncGradientsOptimizer(driver.runtime, [worker], learner, grads_per_step=12)
        await pipeline.step()
        assert await driver.get(worker.versions_seen.remote(), timeout_s=30) == list(range(12))
        assert pipeline.num_steps_trained == pipeline.num_steps_sampled > 0


async def test_impala_drops_the_samples_of_a_dead_worker_and_goes_on(tmp_path, serial):
    """Samples wait in their worker until a train batch is full; when the worker dies
    they are gone: the pipeline forgets them, replaces the worker and keeps training."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        worker = await driver.create_actor("tests.actors.scripted:ScriptedWorker", args=(64,))
        learner = await _learner(driver)

        async def replace(old):
            return await driver.create_actor("tests.actors.scripted:ScriptedWorker",
                                             args=(64, 1))

        pipeline = AsyncSamplesOptimizer(driver.runtime, [worker], learner,
                                         train_batch_size=256, replace_worker=replace,
                                         **IMPALA_PIPELINE)
        await _until(lambda: 64 <= pipeline.pending_rows < 256, pipeline)
        driver.node.kill_actor(worker)
        await _until(lambda: pipeline.num_worker_failures == 1, pipeline)
        assert all(ref.owner != worker.endpoint for ref, _ in pipeline.pending)
        sampled = pipeline.num_steps_sampled
        await _until(lambda: pipeline.num_steps_trained >= 256 * 4
                     and pipeline.num_steps_sampled >= sampled + 1024, pipeline)
        assert (await pipeline.stats())["num_worker_failures"] == 1
        await pipeline.stop()


async def test_apex_priorities_never_reach_a_replacement_shard_it_did_not_replay(tmp_path, serial):
    """Replays still in the learner when their shard dies must not send priorities to the
    empty shard that took its place (they would land on unrelated rows)."""
    async with Driver.start(str(tmp_path / "s"), serial=serial) as driver:
        workers = [await driver.create_actor("tests.actors.scripted:ScriptedWorker",
                                             args=(64, i)) for i in range(2)]
        shards = [await _shard(driver, starts=128, seed=i) for i in range(2)]
        learner = await _learner(driver)
        replacements = []

        async def replace_shard(old):
            new = await _shard(driver, starts=128, seed=7)
            replacements.append(new)
            return new

        pipeline = AsyncReplayOptimizer(driver.runtime, workers, shards, learner, seed=0,
                                        replace_shard=replace_shard, **APEX_PIPELINE)
        await _until(lambda: pipeline.num_steps_trained >= 32 * 30, pipeline, timeout_s=120)
        driver.node.kill_actor(shards[0])
        await _until(lambda: replacements, pipeline)
        trained = pipeline.num_steps_trained
        await _until(lambda: pipeline.num_steps_trained >= trained + 32 * 30, pipeline,
                     timeout_s=120)

        async def until_the_replacement_is_updated() -> None:
            # Under load the replacement may still be filling to learning_starts after the
            # rows above (trained from the other shard): go on until it has been replayed.
            while not (await driver.get(replacements[0].record.remote(),
                                        timeout_s=30))["updates"]:
                await pipeline.step(timeout_s=0.5)

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(until_the_replacement_is_updated(), 120)
        await pipeline.stop()
        record = await driver.get(replacements[0].record.remote(), timeout_s=30)
        served = set(record["served"])
        assert record["updates"], "the replacement shard got no priority update"
        assert [u for u in record["updates"] if u not in served] == []
