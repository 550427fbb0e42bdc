"""Batch replay (``batch_replay: true``, the seeds' BatchReplayActor): whole sample batches
kept in arrival order, evicted oldest first past the shard's share of ``buffer_size``,
replayed whole at random from ``learning_starts`` on; and an Ape-X run on it end to end."""

from __future__ import annotations

import time

import numpy as np

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config.algorithm import load_config
from actorrl.data.batch import MultiAgentBatch, SampleBatch
from actorrl.runtime import Driver

SHARD = "actorrl.replay.actor:BatchReplayActor"


def _batch(marker: int, rows: int = 100) -> SampleBatch:
    """Rows whose obs all hold ``marker`` (to tell replayed batches apart)."""
    return SampleBatch(obs=np.full((rows, 4), marker, np.float32),
                       actions=np.zeros(rows, np.int64),
                       rewards=np.arange(rows, dtype=np.float32))


def _marker(batch: MultiAgentBatch) -> int:
    obs = batch.policy_batches["default_policy"]["obs"]
    assert (obs == obs[0, 0]).all()  # one whole stored batch, never a mix
    return int(obs[0, 0])


async def _replays(driver: Driver, shard, n: int) -> list[MultiAgentBatch | None]:
    return await driver.get([shard.replay.remote() for _ in range(n)], timeout_s=30)


async def test_batches_are_added_replayed_whole_and_evicted_oldest_first(tmp_path):
    """Shard share: buffer 500 / 2 shards = 250 rows, learning_starts 300 / 2 = 150 steps.
    Nothing is replayed before 150 steps were added; then stored batches come back whole
    (the random choice reaches each); past 250 rows the oldest batch goes."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        shard = await driver.create_actor(SHARD, args=({
            "buffer_size": 500, "learning_starts": 300, "num_replay_buffer_shards": 2,
            "batch_replay": True, "prioritized_replay": False,
            "train_batch_size": 32},), kwargs={"seed": 0}, num_cpus=0)

        async def add(marker: int, rows: int = 100) -> int:
            return await driver.get(shard.add_batch.remote([driver.put(_batch(marker, rows))]),
                                    timeout_s=30)

        async def stats() -> dict:
            return await driver.get(shard.stats.remote(), timeout_s=30)

        assert await add(1) == 100
        assert await _replays(driver, shard, 3) == [None, None, None]  # 100 < 150
        await add(2)
        replayed = await _replays(driver, shard, 40)
        assert all(b is not None and b.count == 100 for b in replayed)
        assert {_marker(b) for b in replayed} == {1, 2}
        assert await stats() == {"cur_size": 200, "num_added": 200}

        await add(3)  # 300 > 250: batch 1 goes
        assert await stats() == {"cur_size": 200, "num_added": 300}
        assert {_marker(b) for b in await _replays(driver, shard, 40)} == {2, 3}
        await add(4, rows=40)
        await add(5, rows=40)  # 280 > 250: batch 2 goes; 180 rows left
        assert await stats() == {"cur_size": 180, "num_added": 380}
        assert {_marker(b) for b in await _replays(driver, shard, 80)} == {3, 4, 5}

        # A batch bigger than the share stays alone (it is never evicted by itself).
        await add(6, rows=300)
        assert await stats() == {"cur_size": 300, "num_added": 680}
        assert {_marker(b) for b in await _replays(driver, shard, 5)} == {6}
        await driver.get(shard.update_priorities.remote({"default_policy": ([0], [1.0])}),
                         timeout_s=30)  # no priorities in batch replay: a no-op


async def test_multi_agent_batches_are_kept_whole(tmp_path):
    """A multi-agent batch is stored and replayed with all its policies' rows."""
    async with Driver.start(str(tmp_path / "s"), serial=True) as driver:
        shard = await driver.create_actor(SHARD, args=({
            "buffer_size": 1000, "learning_starts": 0, "batch_replay": True,
            "prioritized_replay": False},), num_cpus=0)
        batch = MultiAgentBatch({"p0": _batch(7, 30), "p1": _batch(8, 20)}, 30)
        assert await driver.get(shard.add_batch.remote([driver.put(batch)]), timeout_s=30) == 30
        [replayed] = await _replays(driver, shard, 1)
        assert replayed.count == 30
        assert {pid: b.count for pid, b in replayed.policy_batches.items()} == {"p0": 30,
                                                                               "p1": 20}
        assert (replayed.policy_batches["p1"]["obs"] == 8).all()


async def test_apex_with_batch_replay_trains_end_to_end(tmp_path):
    """Ape-X with batch_replay: the shard stores whole sample batches within its size, the
    learner trains on replayed ones (no priorities), results keep coming."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {
        "batch_replay": True, "prioritized_replay": False, "buffer_size": 2000,
        "learning_starts": 300, "num_workers": 1, "seed": 0, "min_iter_time_s": 0.5})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        deadline = time.monotonic() + 120
        results = [await trainer.train()]
        while (results[-1]["num_steps_trained"] < 3000 or
               results[-1]["info"]["replay_shard_0"]["num_added"] <= 2000) and \
                time.monotonic() < deadline:
            results.append(await trainer.train())
        await trainer.stop()
    last = results[-1]
    shard = last["info"]["replay_shard_0"]
    assert last["num_steps_trained"] >= 3000
    assert shard["num_added"] > 2000 >= shard["cur_size"] > 0  # evicted down to the size
    assert "default_policy" in last["info"]["learner"]
    steps = [r["timesteps_total"] for r in results]
    assert steps == sorted(steps) and steps[-1] > steps[0]
