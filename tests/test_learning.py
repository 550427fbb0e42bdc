"""End to end: each algorithm, with 2 rollout worker processes and a learner process, learns
CartPole-v1 to a mean return of 150 within a bounded time, and leaves no process behind.
Plus: an Ape-X run keeps training when a rollout worker is SIGKILLed."""

from __future__ import annotations

import os
import signal
import time

import pytest

from actorrl.algorithms import Trainer, get_algorithm
from actorrl.config import load_config
from actorrl.runtime import Driver
from tests.helpers.procs import pids_alive

pytestmark = pytest.mark.learning

THRESHOLD = 150.0
BUDGET_S = {"apex": 180.0, "a3c": 150.0, "a2c": 150.0, "impala": 150.0}


def _actor_pids(driver: Driver) -> list[int]:
    return [running.process.pid for running in driver.node.actors.values()]


@pytest.mark.parametrize("algorithm", ["apex", "a3c", "a2c", "impala"])
async def test_algorithm_learns_cartpole(algorithm, tmp_path):
    """Mean episode return reaches 150 on CartPole-v1 with 2 workers within the budget."""
    spec = get_algorithm(algorithm)
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0,
                                           "min_iter_time_s": 1.0})
    best = float("-inf")
    history = []
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        pids = _actor_pids(driver)
        assert len(pids) >= 3  # 2 workers + learner (+ replay shard)
        start = time.monotonic()
        while time.monotonic() - start < BUDGET_S[algorithm]:
            result = await trainer.train()
            reward = result["episode_reward_mean"]
            history.append((result["timesteps_total"], round(reward, 1)))
            if reward == reward:  # not NaN
                best = max(best, reward)
            if best >= THRESHOLD:
                break
        assert result["timesteps_total"] > 0 and result["num_steps_trained"] > 0
        await trainer.stop()
    assert best >= THRESHOLD, f"{algorithm} reached only {best}: {history}"
    assert pids_alive(pids, timeout_s=15) == []


async def test_apex_keeps_training_when_a_worker_and_the_shard_are_killed(tmp_path):
    """SIGKILL of a rollout worker mid-run: the failure is reported, the worker replaced,
    results keep coming and the sampled step count keeps growing. Then SIGKILL of the
    replay shard: an empty shard takes its place and training goes on."""
    spec = get_algorithm("apex")
    config = load_config(spec.config_cls, {"num_workers": 2, "seed": 0,
                                           "min_iter_time_s": 1.0})
    async with Driver.start(str(tmp_path / "session")) as driver:
        trainer = await Trainer.create(spec, config, driver)
        first = await trainer.train()
        victim = trainer.workers[0]
        process = driver.node.process_of(victim)
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        results = [await trainer.train() for _ in range(4)]
        last = results[-1]
        assert last["info"]["num_worker_failures"] >= 1
        assert last["info"]["num_worker_restarts"] >= 1
        assert last["num_healthy_workers"] == 2
        assert victim not in trainer.workers
        steps = [first["timesteps_total"]] + [r["timesteps_total"] for r in results]
        assert steps == sorted(steps) and steps[-1] > steps[1], steps

        shard = trainer.learner_side_actors[0]
        os.kill(driver.node.process_of(shard).pid, signal.SIGKILL)
        after = [await trainer.train() for _ in range(4)]
        assert after[-1]["info"]["num_shard_failures"] == 1
        assert shard not in trainer.learner_side_actors
        assert after[-1]["num_steps_trained"] > last["num_steps_trained"]
        assert after[-1]["timesteps_total"] > last["timesteps_total"]
        assert "policy_default_policy" in after[-1]["info"]["replay_shard_0"]
        pids = _actor_pids(driver)
        await trainer.stop()
    assert pids_alive(pids, timeout_s=15) == []
